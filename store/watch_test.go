package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// recordingWatcher keeps what a Watcher is told.
type recordingWatcher struct {
	mu        sync.Mutex
	committed [][]buckets.Reading
	removed   []buckets.DeviceID
}

func (w *recordingWatcher) Committed(rs []buckets.Reading) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.committed = append(w.committed, append([]buckets.Reading(nil), rs...))
}

func (w *recordingWatcher) Removed(dev buckets.DeviceID) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.removed = append(w.removed, dev)
}

func TestWatchTellsCommitsAndRemovals(t *testing.T) {
	t.Parallel()
	ts := newTestStore(t)
	ctx := context.Background()
	w := &recordingWatcher{}
	stop := ts.Watch(w.Committed, w.Removed)

	// Two days in one write: one commit per day table, each after it
	// committed.
	a := reading("dev-a", dayTick(today-1, time.Hour), "temp", 1.5)
	b := reading("dev-a", dayTick(today, time.Hour), "temp", 2.5)
	ts.write(t, a, b)
	require.Len(t, w.committed, 2)
	assert.Equal(t, []buckets.Reading{a}, w.committed[0])
	assert.Equal(t, []buckets.Reading{b}, w.committed[1])

	// A redelivery changes nothing and is not told.
	ts.write(t, b)
	assert.Len(t, w.committed, 2)

	// An invalid write commits nothing.
	require.Error(t, ts.Write(ctx, []buckets.Reading{{Device: "dev-a"}}))
	assert.Len(t, w.committed, 2)

	_, err := ts.DeleteDevice(ctx, "dev-a")
	require.NoError(t, err)
	assert.Equal(t, []buckets.DeviceID{"dev-a"}, w.removed)

	ts.write(t, reading("dev-b", dayTick(today-1, 2*time.Hour), "temp", 3.0))
	_, err = ts.DropTable(ctx, today-1)
	require.NoError(t, err)
	assert.Equal(t, []buckets.DeviceID{"dev-a", ""}, w.removed)

	stop()
	ts.write(t, reading("dev-c", dayTick(today, 2*time.Hour), "temp", 4.0))
	assert.Len(t, w.committed, 3)
}
