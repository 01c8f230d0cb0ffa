package colcache

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestNilCacheCachesNothing(t *testing.T) {
	var c *Cache[string]
	c.Put([]byte("k"), Copy([]buckets.Ticks{1}, []float64{2}))
	c.PutList([]byte("l"), "list", 10)
	c.Wait()
	_, ok := c.Get([]byte("k"))
	require.False(t, ok)
	_, ok = c.GetList([]byte("l"))
	require.False(t, ok)
	h, m := c.Stats()
	require.Zero(t, h+m)
	c.Close()
}

func TestColumnsAndListsKeepApart(t *testing.T) {
	_, err := New[string](1 << 19)
	require.ErrorContains(t, err, "at least 1 MiB")
	c, err := New[string](4 << 20)
	require.NoError(t, err)
	defer c.Close()
	ticks, vals := []buckets.Ticks{10, 20}, []float64{1.5, 2.5}
	col := Key(nil, 1, 7, []byte("dev/blk"), []byte("temp"))
	list := ListKey(nil, 1, 7, []byte("dev/blk"))
	c.Put(col, Copy(ticks, vals))
	c.Put(Key(nil, 1, 7, []byte("dev/blk"), []byte("absent")), Copy(nil, nil))
	c.PutList(list, "blocks", 100)
	c.Wait()
	vals[0] = 99 // the cache holds a copy

	got, ok := c.Get(col)
	require.True(t, ok)
	require.Equal(t, &Column{Ticks: []buckets.Ticks{10, 20}, Vals: []float64{1.5, 2.5}}, got)
	empty, ok := c.Get(Key(nil, 1, 7, []byte("dev/blk"), []byte("absent")))
	require.True(t, ok, "a name the block lacks is cached as an empty column")
	require.Empty(t, empty.Vals)
	l, ok := c.GetList(list)
	require.True(t, ok)
	require.Equal(t, "blocks", l)
	_, ok = c.GetList(col)
	require.False(t, ok, "a column is not a list")
	_, ok = c.Get(list)
	require.False(t, ok, "a list is not a column")
	for _, k := range [][]byte{
		Key(nil, 2, 7, []byte("dev/blk"), []byte("temp")), // another opening
		Key(nil, 1, 8, []byte("dev/blk"), []byte("temp")), // another version
		Key(nil, 1, 7, []byte("dev/bl"), []byte("ktemp")), // key and name split elsewhere
	} {
		_, ok := c.Get(k)
		require.False(t, ok, "%q", k)
	}
	h, m := c.Stats()
	require.Equal(t, int64(3), h)
	require.Equal(t, int64(5), m)
}

// TestCacheStaysWithinItsBytes puts ten times its size of columns.
func TestCacheStaysWithinItsBytes(t *testing.T) {
	const size = 2 << 20
	c, err := New[string](size)
	require.NoError(t, err)
	defer c.Close()
	vals := make([]float64, 360)
	ticks := make([]buckets.Ticks, 360)
	for i := range 10 * size / (16 * 360) {
		c.Put(Key(nil, 1, uint64(i), []byte(fmt.Sprintf("dev/%d", i)), []byte("v")), Copy(ticks, vals))
	}
	c.Wait()
	held := 0
	for i := range 10 * size / (16 * 360) {
		if _, ok := c.Get(Key(nil, 1, uint64(i), []byte(fmt.Sprintf("dev/%d", i)), []byte("v"))); ok {
			held++
		}
	}
	require.Positive(t, held)
	require.LessOrEqual(t, held*16*360, size)
}
