package api

import (
	"bytes"
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestBufferClasses covers the size classes of body buffers: four per
// power of two, each index naming one capacity, every size getting the
// smallest class that holds it, nothing past maxPooledBuffer.
func TestBufferClasses(t *testing.T) {
	for _, tc := range []struct{ n, c, i int }{
		{1, 64 << 10, 0},
		{64 << 10, 64 << 10, 0},
		{64<<10 + 1, 80 << 10, 1},
		{80 << 10, 80 << 10, 1},
		{80<<10 + 1, 96 << 10, 2},
		{128 << 10, 128 << 10, 4},
		{128<<10 + 1, 160 << 10, 5},
		{2_400_000, 5 << 19, 21},
		{3<<20 + 1, 7 << 19, 23},
		{maxPooledBuffer, maxPooledBuffer, bufferClasses - 1},
	} {
		c, i, ok := bufferClass(tc.n)
		require.True(t, ok, "%d", tc.n)
		assert.Equal(t, tc.c, c, "class of %d", tc.n)
		assert.Equal(t, tc.i, i, "index of %d", tc.n)
	}
	_, _, ok := bufferClass(maxPooledBuffer + 1)
	assert.False(t, ok, "a body past maxPooledBuffer is not pooled")
	last := 0
	for n := 1; n <= maxPooledBuffer; n += 4093 {
		c, i, _ := bufferClass(n)
		require.GreaterOrEqual(t, c, n)
		require.LessOrEqual(t, c, max(n+n/4, minBufferClass), "at most a quarter more than asked")
		require.GreaterOrEqual(t, i, last)
		last = i
		cc, ii, _ := bufferClass(c)
		require.Equal(t, [2]int{c, i}, [2]int{cc, ii}, "a class is its own class")
	}
}

// TestBodyBuffersOfAClassAreShared covers the reuse of body buffers by
// requests of about the same size, two in flight at a time: they draw
// buffers of one capacity, so a buffer put back serves either, and the
// lists keep at most GOMAXPROCS times maxPooledBuffer bytes in all. A
// size class past the limit is not used.
func TestBodyBuffersOfAClassAreShared(t *testing.T) {
	if prev := runtime.GOMAXPROCS(0); prev < 2 { // room for the two in flight
		runtime.GOMAXPROCS(2)
		t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	}
	const limit = 16 << 20
	buffers.idle, buffers.bytes = [bufferClasses][][]byte{}, 0
	putBytes(make([]byte, 0, 2_400_000))
	assert.Zero(t, buffers.bytes, "a buffer not of a class size is not kept")
	a, b := getBytes(2_390_000, limit), getBytes(2_410_000, limit)
	assert.Equal(t, cap(a), cap(b), "bodies of about the same size, buffers of one class")
	putBytes(a)
	putBytes(b)
	for i := range 40 {
		small, large := 2_390_000+i, 2_410_000+i
		if i%2 == 0 {
			small, large = large, small
		}
		x, y := getBytes(small, limit), getBytes(large, limit)
		assert.ElementsMatch(t, []*byte{unsafe.SliceData(a), unsafe.SliceData(b)},
			[]*byte{unsafe.SliceData(x), unsafe.SliceData(y)}, "round %d: the two buffers kept", i)
		putBytes(x)
		putBytes(y)
	}

	buffers.idle, buffers.bytes = [bufferClasses][][]byte{}, 0
	n := runtime.GOMAXPROCS(0)
	_, largest, _ := bufferClass(maxPooledBuffer)
	var held [][]byte
	for range n {
		held = append(held, getBytes(maxPooledBuffer, limit))
	}
	held = append(held, getBytes(100_000, limit)) // another class
	for _, h := range held {
		putBytes(h)
	}
	assert.Len(t, buffers.idle[largest], n, "GOMAXPROCS of the largest class fill the lists")
	_, other, _ := bufferClass(100_000)
	assert.Empty(t, buffers.idle[other], "past GOMAXPROCS times maxPooledBuffer bytes, a buffer is not kept")
	assert.Equal(t, n*maxPooledBuffer, buffers.bytes)

	tight := getBytes(2_390_000, 2_400_000)
	assert.Equal(t, 2_390_000, cap(tight), "its class would pass the limit: exactly what was asked")
}

// TestBodyOfUnknownLengthGrowsThroughKeptBuffers covers a body read
// without a length (gzipped, or sent in chunks): it grows through the
// size classes, so the next one takes the buffers it outgrew and its
// final one from the lists instead of allocating each. The budget is
// charged the capacity of every buffer it draws.
func TestBodyOfUnknownLengthGrowsThroughKeptBuffers(t *testing.T) {
	if prev := runtime.GOMAXPROCS(0); prev < 2 { // room for every step
		runtime.GOMAXPROCS(2)
		t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	}
	buffers.idle, buffers.bytes = [bufferClasses][][]byte{}, 0
	body := bytes.Repeat([]byte("m,device=d v=1 1795309323000000000\n"), 30_000) // about 1 MB
	budget := newByteBudget(64 << 20)
	read := func() {
		res := &reservation{b: budget}
		defer res.release()
		b, err := readCharged(bytes.NewReader(body), 16<<20, res, 0, -1)
		require.NoError(t, err)
		require.Equal(t, body, b)
		assert.Equal(t, int64(cap(b)), res.n, "charged the buffer it holds")
		putBytes(b)
	}
	read()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		read()
	}
	runtime.ReadMemStats(&after)
	// Growing from 64 KiB to 2 MiB allocates about 4 MB when nothing
	// is kept.
	assert.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(10*64<<10), "a body's growth takes kept buffers")
}
