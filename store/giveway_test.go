package store

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/telemetryd/telemetryd/store/giveway"
)

// The store's reads record queries, which the compactor gives way to;
// its writes do not.
func TestQueriesRecordedByTheStoresReads(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	d := today
	ts.write(t, series("dev", dayTick(d, time.Hour), time.Second, 3)...)
	assert.Zero(t, ts.queries.Last(), "writes are not queries")
	_, err := ts.Latest(t.Context(), "dev", 1)
	assert.NoError(t, err)
	assert.True(t, ts.queries.Recent(giveway.Now()), "a latest query was recorded")
}
