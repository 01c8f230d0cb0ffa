package diskfit

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var defaults = Sizes{StreamMaxBytes: 4 << 30, RejectedMaxBytes: 1 << 30, MQTTStreamMaxBytes: 64 << 20, DiskReserve: 256 << 20}

func none(string) bool { return false }

func TestFit(t *testing.T) {
	small := Room{Dir: "/data", Free: 300 << 20}
	t.Run("defaults on a small disk are fitted", func(t *testing.T) {
		c := defaults
		changed, kept, err := Fit(&c, defaults, none, small, true, true)
		require.NoError(t, err)
		assert.Empty(t, kept)
		assert.Len(t, changed, 4)
		assert.LessOrEqual(t, c.StreamMaxBytes+c.RejectedMaxBytes+MQTTStreams*c.MQTTStreamMaxBytes, small.Free/2)
		assert.GreaterOrEqual(t, c.MQTTStreamMaxBytes, int64(1<<20))
		assert.LessOrEqual(t, c.DiskReserve, small.Free/8)
	})
	t.Run("defaults on a large disk are kept", func(t *testing.T) {
		c := defaults
		changed, kept, err := Fit(&c, defaults, none, Room{Dir: "/data", Free: 1 << 40}, true, true)
		require.NoError(t, err)
		assert.Empty(t, changed)
		assert.Empty(t, kept)
		assert.Equal(t, defaults, c)
	})
	t.Run("a stream size set that does not fit is refused", func(t *testing.T) {
		c := defaults
		_, _, err := Fit(&c, defaults, func(f string) bool { return f == "stream-max-bytes" }, small, true, false)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "-stream-max-bytes 4GiB")
		assert.Contains(t, err.Error(), "300 MiB free under /data")
	})
	t.Run("the boundary: set streams of exactly 75% fit", func(t *testing.T) {
		c := defaults
		c.StreamMaxBytes, c.RejectedMaxBytes = small.Free/4*3-(1<<20), 1<<20
		set := func(f string) bool { return f == "stream-max-bytes" || f == "rejected-max-bytes" }
		_, _, err := Fit(&c, defaults, set, small, true, false)
		require.NoError(t, err)
		c.StreamMaxBytes++
		_, _, err = Fit(&c, defaults, set, small, true, false)
		require.Error(t, err)
	})
	t.Run("a reserve set over half the disk is kept with a warning", func(t *testing.T) {
		c := defaults
		c.DiskReserve = 1 << 40
		_, kept, err := Fit(&c, defaults, none, small, false, false)
		require.NoError(t, err)
		require.Len(t, kept, 1)
		assert.Contains(t, kept[0], "-disk-reserve")
		assert.Equal(t, int64(1<<40), c.DiskReserve)
	})
}
