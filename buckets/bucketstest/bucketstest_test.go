package bucketstest_test

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets/bucketstest"
)

func TestSyncBufferRecords(t *testing.T) {
	var buf bucketstest.SyncBuffer
	log := slog.New(slog.NewJSONHandler(&buf, nil))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 50 {
				log.Info("tick", "writer", i, "n", j)
			}
		})
	}
	wg.Wait()
	log.Warn("done")

	ticks, err := buf.Records("tick")
	require.NoError(t, err)
	assert.Len(t, ticks, 400, "no write was lost or interleaved")
	all, err := buf.Records("")
	require.NoError(t, err)
	assert.Len(t, all, 401)
	assert.Equal(t, "WARN", all[400]["level"])

	_, _ = buf.Write([]byte("not json\n"))
	_, err = buf.Records("tick")
	assert.ErrorContains(t, err, `log line "not json"`)
}

func TestClock(t *testing.T) {
	start := time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC)
	c := bucketstest.NewClock(start)
	assert.Equal(t, start, c.Now())
	c.Add(90 * time.Minute)
	assert.Equal(t, start.Add(90*time.Minute), c.Now())
	c.Add(-time.Hour)
	assert.Equal(t, start.Add(30*time.Minute), c.Now())
	c.Set(start)
	assert.Equal(t, start, c.Now())
}
