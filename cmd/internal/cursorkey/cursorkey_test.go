package cursorkey

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestLoadKeepsOneKeyPerInstallation(t *testing.T) {
	dir := t.TempDir()
	k1, err := Load(dir)
	require.NoError(t, err)
	assert.Len(t, k1, 32)
	k2, err := Load(dir)
	require.NoError(t, err)
	assert.Equal(t, k1, k2, "the key survives restarts")
	st, err := os.Stat(filepath.Join(dir, File))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	other, err := Load(t.TempDir())
	require.NoError(t, err)
	assert.NotEqual(t, k1, other, "each installation has its own")

	require.NoError(t, os.WriteFile(filepath.Join(dir, File), []byte("zz\n"), 0o600))
	_, err = Load(dir)
	assert.ErrorContains(t, err, "is damaged")
}
