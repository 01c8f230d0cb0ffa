package devindex

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// FuzzDecodeAttrRecord feeds arbitrary bytes to the attribute record
// decoder: it never panics, and whatever it accepts keeps every rule
// (limits, valid sorted names, valid values) and encodes again into a
// record that decodes to the same thing. The seed corpus is in
// testdata/fuzz/FuzzDecodeAttrRecord.
func FuzzDecodeAttrRecord(f *testing.F) {
	f.Add(encodeAttrRecord(nil, &attrRecord{floor: 5, set: buckets.Attributes{{Name: "fleet", Value: "East"}},
		at: []buckets.Ticks{7}, gone: []tombstone{{name: "model", at: 9}}}))
	f.Add(encodeAttrRecord(nil, &attrRecord{}))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeAttrRecord(b)
		if err != nil {
			return
		}
		require.LessOrEqual(t, len(r.set), buckets.MaxAttributes)
		require.LessOrEqual(t, len(r.gone), maxTombstones)
		require.Len(t, r.at, len(r.set))
		require.NoError(t, r.validate())
		again, err := decodeAttrRecord(encodeAttrRecord(nil, r))
		require.NoError(t, err)
		require.Equal(t, r, again)
	})
}

// FuzzParseEntityKey checks that entity keys split back into what
// made them, whatever bytes the value holds.
func FuzzParseEntityKey(f *testing.F) {
	f.Add("fleet", "East", "dev-1")
	f.Add("a", "x\x00\x00y", "0")
	f.Fuzz(func(t *testing.T, name, value, dev string) {
		if buckets.ValidateAttributeName(name) != nil || buckets.DeviceID(dev).Validate() != nil {
			return
		}
		n, v, d, ok := parseEntityKey(EntityKey(name, value, buckets.DeviceID(dev)))
		require.True(t, ok)
		require.Equal(t, name, n)
		require.Equal(t, value, v)
		require.Equal(t, buckets.DeviceID(dev), d)
	})
}
