package lineproto

// arena hands out short slices of T backed by a few large chunks that
// the next request reuses (the mapper is pooled), so that the values of
// a request's readings cost a handful of allocations, not one or more
// per line. A slice it returned stays valid until reset.
type arena[T any] struct {
	cur    []T   // the chunk being filled: chunks[chunk]
	chunks [][]T // every chunk, kept across requests
	chunk  int
}

// arenaChunk is the least number of elements of a chunk.
const arenaChunk = 4096

// alloc returns a slice of n zero elements with capacity n.
func (a *arena[T]) alloc(n int) []T {
	if cap(a.cur)-len(a.cur) < n {
		a.next(n)
	}
	start := len(a.cur)
	a.cur = a.cur[:start+n]
	return a.cur[start : start+n : start+n]
}

// next makes cur an empty chunk with room for n elements.
func (a *arena[T]) next(n int) {
	if a.cur != nil {
		a.chunk++
	}
	for a.chunk < len(a.chunks) && cap(a.chunks[a.chunk]) < n {
		a.chunk++
	}
	if a.chunk == len(a.chunks) {
		a.chunks = append(a.chunks, make([]T, 0, max(arenaChunk, n)))
	}
	a.cur = a.chunks[a.chunk][:0]
}

// reset zeroes what was handed out (dropping the references it holds)
// and makes every chunk available again.
func (a *arena[T]) reset() {
	for _, c := range a.chunks {
		clear(c[:cap(c)])
	}
	a.chunk, a.cur = 0, nil
}
