package repair_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/storetest"
)

// A table file that a crash interrupted while Badger wrote it is not
// in the MANIFEST: it must not make the day unavailable (Badger removes
// it when the table opens).
func TestTableFileMissingFromManifestIsIgnored(t *testing.T) {
	ts := storetest.New(t)
	ctx := context.Background()
	k := storetest.At(-time.Hour)
	ts.MustWrite(t, storetest.Reading("dev", k, "v", 1))
	ts = ts.Reopen(t)
	ts.MustWrite(t, storetest.Reading("dev", k+1, "v", 2))
	require.NoError(t, ts.Close())
	stray := filepath.Join(ts.Dir, "tables", storetest.Today.String(), "000999.sst")
	require.NoError(t, os.WriteFile(stray, []byte("half a table"), 0o644))
	ts = storetest.Open(t, ts.Dir, ts.Clock)
	got, err := ts.Latest(ctx, "dev", 10)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Reading{storetest.Reading("dev", k+1, "v", 2), storetest.Reading("dev", k, "v", 1)}, got)
	_, err = os.Stat(stray)
	assert.True(t, os.IsNotExist(err), "Badger removed the stray file")
}
