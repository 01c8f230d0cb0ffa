package retention

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

type nopDropper struct{}

func (nopDropper) Tables(context.Context) ([]buckets.TableInfo, error) { return nil, nil }
func (nopDropper) DropTable(context.Context, buckets.Day) (buckets.TableDrop, error) {
	return buckets.TableDrop{}, nil
}

func TestWorkerDefaults(t *testing.T) {
	w, err := NewWorker(nopDropper{}, Config{Policy: Policy{Retention: time.Hour}})
	require.NoError(t, err)
	assert.Equal(t, time.Hour, w.interval)
	assert.Equal(t, 0.1, w.jitter)
	assert.NotNil(t, w.log)
	assert.NotNil(t, w.now)
	for range 1000 {
		d := w.nextWait()
		require.GreaterOrEqual(t, d, 54*time.Minute)
		require.LessOrEqual(t, d, 66*time.Minute)
	}
}

func TestNextWaitJitter(t *testing.T) {
	var draw float64
	w, err := NewWorker(nopDropper{}, Config{
		Policy:   Policy{Retention: time.Hour},
		Interval: 10 * time.Minute,
		Jitter:   0.2,
		Rand:     func() float64 { return draw },
	})
	require.NoError(t, err)
	for _, tc := range []struct {
		draw float64
		want time.Duration
	}{
		{0, 8 * time.Minute},
		{0.25, 9 * time.Minute},
		{0.5, 10 * time.Minute},
		{0.75, 11 * time.Minute},
		{0.999999, 12*time.Minute - 1200*time.Microsecond},
	} {
		draw = tc.draw
		assert.InDelta(t, float64(tc.want), float64(w.nextWait()), float64(time.Millisecond), "draw %g", tc.draw)
	}
}
