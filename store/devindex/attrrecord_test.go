package devindex

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestAttrRecordDecodeRefusesDamage(t *testing.T) {
	r := &attrRecord{floor: 5, set: attrs("fleet", "East", "model", "F"), at: []buckets.Ticks{7, 9},
		gone: []tombstone{{name: "color", at: 8}}}
	b := encodeAttrRecord(nil, r)
	got, err := decodeAttrRecord(b)
	require.NoError(t, err)
	assert.Equal(t, r, got)
	for i := range b {
		for bit := range 8 {
			c := append([]byte(nil), b...)
			c[i] ^= 1 << bit
			_, err := decodeAttrRecord(c)
			require.Error(t, err, "byte %d bit %d", i, bit)
		}
	}
	for n := range len(b) {
		_, err := decodeAttrRecord(b[:n])
		require.Error(t, err, "truncated to %d bytes", n)
	}
}
func TestEntityKeyRoundTrip(t *testing.T) {
	for _, v := range []string{"East", "a\x00b", "\x00", "x\x00\x00"} {
		name, value, dev, ok := parseEntityKey(EntityKey("fleet", v, "dev-1"))
		require.True(t, ok)
		assert.Equal(t, "fleet", name)
		assert.Equal(t, v, value)
		assert.Equal(t, buckets.DeviceID("dev-1"), dev)
	}
	_, _, _, ok := parseEntityKey([]byte{attrEntityPrefix, 'a'})
	assert.False(t, ok)
}
