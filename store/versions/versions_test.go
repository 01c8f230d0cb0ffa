package versions

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Compaction may drop overwritten versions up to the oldest version a
// reader uses, or up to the last commit when nobody reads.
func TestDiscardVersionFollowsReaders(t *testing.T) {
	v := Versions{readers: map[uint64]int{}}
	assert.Equal(t, uint64(7), v.completedLocked(7), "no readers")
	assert.Equal(t, uint64(7), v.last)
	v.readers[7], v.readers[9] = 1, 2
	assert.Equal(t, uint64(7), v.completedLocked(10), "the oldest reader's version")
	assert.Equal(t, uint64(10), v.last)
	delete(v.readers, 7)
	assert.Equal(t, uint64(9), v.completedLocked(11))
}
