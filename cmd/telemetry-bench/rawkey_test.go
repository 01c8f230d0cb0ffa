package main

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/telemetryd/telemetryd/buckets"
)

// someTicks is 2026-11-22T01:02:03.456Z.
const someTicks buckets.Ticks = 639309061234560000

func TestRawKeyLayout(t *testing.T) {
	want := binary.BigEndian.AppendUint64([]byte("dev-1/"), 2516069914765439999)
	assert.Equal(t, want, appendRawKey(nil, "dev-1", someTicks))
	assert.Equal(t, append([]byte("prefix"), want...), appendRawKey([]byte("prefix"), "dev-1", someTicks), "dst stays in front")
	assert.Equal(t, []byte("dev-1/"), rawPrefix("dev-1"))
}

func TestRawKeyOrderNewestFirst(t *testing.T) {
	ordered := []buckets.Ticks{buckets.MaxTicks, buckets.MaxTicks - 1, someTicks + 1, someTicks, 1, 0}
	for i := 1; i < len(ordered); i++ {
		newer, older := ordered[i-1], ordered[i]
		assert.Negative(t, bytes.Compare(appendRawKey(nil, "dev-1", newer), appendRawKey(nil, "dev-1", older)),
			"key(%d) must sort before key(%d)", newer, older)
	}
}

func TestRawPrefixSeparatesDevices(t *testing.T) {
	pairs := [][2]buckets.DeviceID{{"a", "ab"}, {"a", "a-"}, {"dev-1", "dev-10"}}
	for _, p := range pairs {
		short, long := p[0], p[1]
		for _, k := range []buckets.Ticks{0, someTicks, buckets.MaxTicks, buckets.TicksFromInverted(0x2a2f2f2f2f2f2f2f)} {
			assert.False(t, bytes.HasPrefix(appendRawKey(nil, long, k), rawPrefix(short)), "%q vs %q", short, long)
			assert.False(t, bytes.HasPrefix(appendRawKey(nil, short, k), rawPrefix(long)), "%q vs %q", long, short)
			assert.True(t, bytes.HasPrefix(appendRawKey(nil, short, k), rawPrefix(short)))
		}
	}
}
