package buckets

import "unsafe"

// ReadBuffer is memory a reader may build an answer in (the readings
// and their values) instead of allocating it, for a caller that writes
// the answer out and is then done with it, such as an HTTP handler
// encoding a page: the next answer reuses the same memory, so a busy
// query path makes little garbage. A reader that uses the buffer
// leaves in Readings and Values (their length) the storage the answer
// took. The readings of an answer built in a ReadBuffer are valid
// until the buffer is Reset or used again.
type ReadBuffer struct {
	Readings []Reading // storage for the answer's readings
	Values   []Field   // storage for their values
}

// Reset clears what the last answer left in the buffer, so that it
// keeps no strings alive, and makes it ready for the next.
func (b *ReadBuffer) Reset() {
	clear(b.Readings)
	clear(b.Values)
	b.Readings, b.Values = b.Readings[:0], b.Values[:0]
}

// Bytes is the memory the buffer holds.
func (b *ReadBuffer) Bytes() int {
	return cap(b.Readings)*int(unsafe.Sizeof(Reading{})) + cap(b.Values)*int(unsafe.Sizeof(Field{}))
}
