package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// Answers built in a ReadBuffer are the answers built in new memory,
// query after query through the same buffer (sealed blocks, open
// blocks that overlap them, two days, both orders, cursors), and the
// buffer's memory is what they are built in.
func TestReadBufferAnswersAreTheAnswers(t *testing.T) {
	t.Parallel()
	ts := openTestStore(t, t.TempDir(), newTestClock())
	ctx := context.Background()
	first := dayTick(today-1, 23*time.Hour)
	var batch []buckets.Reading
	for i := range 5000 {
		k := first + buckets.Ticks(i)*buckets.TicksPerSecond
		batch = append(batch, reading("dev", k, "hum", i%40, "ok", i%5 != 0, "temp", float64(1800+(i*37)%1000)/100))
		if len(batch) == 500 {
			require.NoError(t, ts.Write(ctx, batch))
			batch = batch[:0]
		}
	}
	ts = ts.reopen(t) // sealed blocks
	// Later writes of some of the same ticks, in open blocks that
	// overlap the sealed ones: their values win.
	for i := 100; i < 4900; i += 700 {
		k := first + buckets.Ticks(i)*buckets.TicksPerSecond
		require.NoError(t, ts.Write(ctx, []buckets.Reading{reading("dev", k, "temp", -1.5, "text", fmt.Sprint("late ", i))}))
	}
	var buf buckets.ReadBuffer
	sec := buckets.Ticks(buckets.TicksPerSecond)
	for _, q := range []buckets.RangeQuery{
		{From: first, To: first + 3600*sec, Order: buckets.Asc, Limit: 3600},
		{From: first + 1000*sec, To: first + 4600*sec, Order: buckets.Asc, Limit: 10_000},
		{From: first, To: first + 5000*sec, Order: buckets.Desc, Limit: 1200},
		{From: first + 3500*sec, To: first + 3700*sec, Order: buckets.Asc, Limit: 7},
		{From: first, To: first + 10*sec, Order: buckets.Desc, Limit: 100},
	} {
		q.Device = "dev"
		for page := 0; page < 3; page++ {
			want, err := ts.Range(ctx, q)
			require.NoError(t, err)
			buf.Reset()
			got, err := ts.RangeIn(ctx, q, &buf)
			require.NoError(t, err)
			require.Equal(t, want, got, "%+v page %d", q, page)
			if len(got.Readings) > 0 {
				require.Same(t, &buf.Readings[:1][0], &got.Readings[0], "the readings are in the buffer")
				require.NotEmpty(t, buf.Values)
			}
			if !got.More {
				break
			}
			last := got.Readings[len(got.Readings)-1].Ticks
			q.After = &last
		}
	}
	for _, n := range []int{1, 10, 3000} {
		want, err := ts.Latest(ctx, "dev", n)
		require.NoError(t, err)
		buf.Reset()
		got, err := ts.LatestIn(ctx, "dev", n, &buf)
		require.NoError(t, err)
		require.Equal(t, want, got, "latest %d", n)
	}
	buf.Reset()
	require.Empty(t, buf.Readings)
	require.Empty(t, buf.Values)
	require.Zero(t, buf.Readings[:1][0], "Reset clears what the last answer left")
}
