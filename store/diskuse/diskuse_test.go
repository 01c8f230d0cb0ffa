package diskuse

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSizesCountAllocatedBlocks checks that a sparse file counts with
// its allocated blocks, that Dir counts only the files directly in dir
// and Tree those below it too.
func TestSizesCountAllocatedBlocks(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "a"), make([]byte, 10000), 0o644))
	sparse, err := os.Create(filepath.Join(dir, "sparse"))
	require.NoError(t, err)
	require.NoError(t, sparse.Truncate(64<<20)) // no block written
	require.NoError(t, sparse.Close())
	require.NoError(t, os.Mkdir(filepath.Join(dir, "sub"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "sub", "b"), make([]byte, 5000), 0o644))

	info, err := os.Stat(filepath.Join(dir, "sparse"))
	require.NoError(t, err)
	assert.Less(t, File(info), int64(1<<20), "a sparse file counts its blocks, not its length")
	top := Dir(dir)
	assert.GreaterOrEqual(t, top, int64(10000))
	assert.Less(t, top, int64(1<<20))
	assert.GreaterOrEqual(t, Tree(dir), top+5000)
	assert.Zero(t, Dir(filepath.Join(dir, "missing")))
}
