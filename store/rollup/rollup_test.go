package rollup

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestParseLevels(t *testing.T) {
	ls, err := ParseLevels("1h:3y, 1m:90d")
	require.NoError(t, err)
	assert.Equal(t, []Level{{time.Minute, 90 * Day}, {time.Hour, 3 * Year}}, ls, "sorted by interval")
	assert.Equal(t, "1m:90d", ls[0].String())
	ls, err = ParseLevels("")
	require.NoError(t, err)
	assert.Empty(t, ls)

	for in, want := range map[string]string{
		"1s:1s":       "",
		"1h:1h":       "",
		"30s:2w":      "",
		"999ms:1d":    "must be at least 1s",
		"1500ms:1d":   "whole number of seconds",
		"7m:1d":       "must divide one hour",
		"2h:1y":       "must divide one hour",
		"1h:59m":      "retention 59m is shorter than the interval",
		"1m:1d,1m:2d": "given twice",
		"1m":          "want interval:retention",
		"1m:0d":       "positive whole number",
		"1m:xd":       "positive whole number",
		"soon:1d":     "want a duration",
		"1m:1d,1s:1d,2s:1d,3s:1d,4s:1d,5s:1d,6s:1d,10s:1d,12s:1d": "at most 8",
		"1s:1d,2s:1d,3s:1d,4s:1d,5s:1d,6s:1d,10s:1d,12s:1d":       "",
	} {
		_, err := ParseLevels(in)
		if want == "" {
			assert.NoError(t, err, in)
			continue
		}
		require.Error(t, err, in)
		assert.Contains(t, err.Error(), want, in)
	}
}

func TestForPicksTheLargestDividingLevel(t *testing.T) {
	ls := []Level{{time.Minute, Day}, {5 * time.Minute, Day}, {time.Hour, Day}}
	for iv, want := range map[time.Duration]int{time.Minute: 0, 10 * time.Minute: 1, 2 * time.Hour: 2, 24 * time.Hour: 2, 90 * time.Second: -1, 30 * time.Second: -1} {
		i, ok := For(ls, buckets.Ticks(iv/100))
		assert.Equal(t, want >= 0, ok, iv)
		if ok {
			assert.Equal(t, want, i, iv)
		}
	}
}

func TestRecordRoundTripAndCorruption(t *testing.T) {
	l := Level{Interval: time.Minute, Retention: Day}
	ss := WindowStart(buckets.MustTicks(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)))
	iv := l.ticks()
	bs := []Bucket{
		{Start: ss, DistinctMs: true, Values: []buckets.NamedSummary{{Name: "a", Summary: buckets.Summary{Count: 2, Sum: 3.5, Min: 1, Max: 2.5, First: 1, Last: 2.5, FirstTicks: ss + 1, LastTicks: ss + iv - 1}}}},
		{Start: ss + 59*iv, Values: []buckets.NamedSummary{{Name: "a", Summary: buckets.Summary{Count: 1, Sum: -0.1, Min: -0.1, Max: -0.1, First: -0.1, Last: -0.1, FirstTicks: ss + 59*iv, LastTicks: ss + 59*iv}}, {Name: "b.c", Summary: buckets.Summary{Count: 1, Sum: 1, Min: 1, Max: 1, First: 1, Last: 1, FirstTicks: ss + 59*iv + 5, LastTicks: ss + 59*iv + 5}}}},
	}
	v := appendRecord(nil, ss, iv, bs)
	var got []Bucket
	require.NoError(t, decodeRecord(v, ss, iv, l.span(), &decoder{}, func(b Bucket) error { got = append(got, b); return nil }))
	assert.Equal(t, bs, got)
	for i := range v {
		bad := append([]byte(nil), v...)
		bad[i] ^= 0x10
		err := decodeRecord(bad, ss, iv, l.span(), &decoder{}, func(Bucket) error { return nil })
		assert.ErrorIs(t, err, ErrCorrupt, "byte %d flipped", i)
	}
	assert.ErrorIs(t, decodeRecord(v[:len(v)-1], ss, iv, l.span(), &decoder{}, func(Bucket) error { return nil }), ErrCorrupt)
}

func newTestSet(t *testing.T, dir string, ls ...Level) *Set {
	t.Helper()
	s, err := Open(dir, Options{Levels: ls, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Badger: func(dir string) badger.Options {
			return badger.DefaultOptions(dir).WithLogger(nil).WithMemTableSize(1 << 20).WithValueThreshold(1 << 10)
		}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func bucketAt(k buckets.Ticks, x float64) Bucket {
	return Bucket{Start: k, DistinctMs: true, Values: []buckets.NamedSummary{{Name: "x", Summary: buckets.Summary{Count: 1, Sum: x, Min: x, Max: x, First: x, Last: x, FirstTicks: k, LastTicks: k}}}}
}

func TestPutReplacesTheWindowsItCoversAndRaisesTheMark(t *testing.T) {
	ctx := context.Background()
	s := newTestSet(t, t.TempDir(), Level{Interval: time.Hour, Retention: Year})
	day := buckets.DayOfTime(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	h := windowTicks
	k := func(i int) buckets.Ticks { return day.Start() + buckets.Ticks(i)*h }
	require.NoError(t, s.Put(ctx, 0, "d", k(0), k(3), []Bucket{bucketAt(k(0), 1), bucketAt(k(2), 3)}, k(3)))
	require.NoError(t, s.Put(ctx, 0, "d", k(2), k(3), []Bucket{bucketAt(k(2), 30)}, k(1))) // the window again; a lower mark
	require.NoError(t, s.Put(ctx, 0, "e", k(0), k(1), []Bucket{bucketAt(k(0), 9)}, k(1)))
	var got []float64
	require.NoError(t, s.Scan(ctx, 0, "d", day.Start(), day.End(), func(b Bucket) error { got = append(got, b.Values[0].Summary.Sum); return nil }))
	assert.Equal(t, []float64{1, 30}, got)
	m, err := s.Mark(0, "d", day)
	require.NoError(t, err)
	assert.Equal(t, k(3), m, "a mark never goes down")
	m, err = s.Mark(0, "d", day+1)
	require.NoError(t, err)
	assert.Equal(t, buckets.Ticks(-1), m)
	require.NoError(t, s.Put(ctx, 0, "d", k(0), k(1), nil, k(3)))
	got = nil
	require.NoError(t, s.Scan(ctx, 0, "d", day.Start(), day.End(), func(b Bucket) error { got = append(got, b.Values[0].Summary.Sum); return nil }))
	assert.Equal(t, []float64{30}, got, "an empty put removes the window")

	err = s.Put(ctx, 0, "d", k(0)+1, k(1), nil, 0)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "not whole windows of one day")
	err = s.Put(ctx, 0, "d", k(23), k(25), nil, 0)
	require.Error(t, err)
}

func TestDropExpiredDropsAMonthOnlyOnceItIsWhollyPastRetention(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s := newTestSet(t, dir, Level{Interval: time.Minute, Retention: 90 * Day}, Level{Interval: time.Hour, Retention: 3 * Year})
	oct := buckets.MustTicks(time.Date(2026, 10, 5, 0, 0, 0, 0, time.UTC))
	for lvl := range 2 {
		require.NoError(t, s.Put(ctx, lvl, "d", oct, oct+windowTicks, []Bucket{bucketAt(oct, 1)}, oct+windowTicks))
	}
	end := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Add(90 * Day) // October's end plus 90 days
	dropped, err := s.DropExpired(ctx, end.Add(-time.Nanosecond))
	require.NoError(t, err)
	assert.Empty(t, dropped)
	dropped, err = s.DropExpired(ctx, end)
	require.NoError(t, err)
	require.Len(t, dropped, 1)
	assert.Equal(t, "1m", dropped[0].Level.Name())
	assert.NoDirExists(t, filepath.Join(dir, "1m", "2026-10"))
	assert.DirExists(t, filepath.Join(dir, "1h", "2026-01"), "a year for an hourly level")
	n := 0
	require.NoError(t, s.Scan(ctx, 0, "d", oct, oct+windowTicks, func(Bucket) error { n++; return nil }))
	assert.Zero(t, n)
	require.NoError(t, s.Scan(ctx, 1, "d", oct, oct+windowTicks, func(Bucket) error { n++; return nil }))
	assert.Equal(t, 1, n)

	// A reopened set finds the periods on disk, and finishes a drop.
	require.NoError(t, s.Close())
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "1h", dropPrefix+"2026-09"), 0o755))
	s = newTestSet(t, dir, Level{Interval: time.Minute, Retention: 90 * Day}, Level{Interval: time.Hour, Retention: 3 * Year})
	ps := s.Periods()
	require.Len(t, ps, 1)
	assert.True(t, strings.HasPrefix(ps[0].Month.Format(time.RFC3339), "2026-01-01"))
	assert.Equal(t, time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC).Add(3*Year), ps[0].Expires)
	assert.NoDirExists(t, filepath.Join(dir, "1h", dropPrefix+"2026-09"))
}

func TestDeleteDeviceRemovesItsBucketsAndMarksOnly(t *testing.T) {
	ctx := context.Background()
	s := newTestSet(t, t.TempDir(), Level{Interval: time.Minute, Retention: Year}, Level{Interval: time.Hour, Retention: Year})
	for _, day := range []buckets.Day{buckets.DayOfTime(time.Date(2026, 10, 31, 0, 0, 0, 0, time.UTC)), buckets.DayOfTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))} {
		k := day.Start()
		for lvl := range 2 {
			for _, dev := range []buckets.DeviceID{"d", "d-2", "e"} {
				require.NoError(t, s.Put(ctx, lvl, dev, k, k+windowTicks, []Bucket{bucketAt(k, 1)}, k+windowTicks))
			}
		}
	}
	n, err := s.DeleteDevice(ctx, "d")
	require.NoError(t, err)
	assert.Equal(t, 2*2*2, n, "a record and a mark per level and day")
	all := buckets.DayOfTime(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC)).Start()
	end := buckets.DayOfTime(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)).Start()
	for lvl := range 2 {
		for dev, want := range map[buckets.DeviceID]int{"d": 0, "d-2": 2, "e": 2} {
			got := 0
			require.NoError(t, s.Scan(ctx, lvl, dev, all, end, func(Bucket) error { got++; return nil }))
			assert.Equal(t, want, got, "level %d, %s", lvl, dev)
		}
		m, err := s.Mark(lvl, "d", buckets.DayOfTime(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)))
		require.NoError(t, err)
		assert.Equal(t, buckets.Ticks(-1), m)
	}
}

func TestMarksReadsEveryDayOfARangeAcrossPeriods(t *testing.T) {
	ctx := context.Background()
	s := newTestSet(t, t.TempDir(), Level{Interval: time.Minute, Retention: Year}) // a period a month
	last := buckets.DayOfTime(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	first := last - 4 // 2026-11-28
	put := func(dev buckets.DeviceID, d buckets.Day, mark buckets.Ticks) {
		require.NoError(t, s.RaiseMark(ctx, 0, dev, d, mark))
	}
	put("d", first-1, first.Start()) // before the range
	put("d", first, first.Start()+1)
	put("d", first+3, (first+3).Start()+4) // in December, the next period
	put("d", last+1, 7)                    // after the range
	put("d/x", first+1, 99)                // a device whose name starts with d's prefix
	put("c", first+2, 98)
	put("e", first+2, 97)
	ms, err := s.Marks(0, "d", first, last)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Ticks{first.Start() + 1, -1, -1, (first + 3).Start() + 4, -1}, ms)
	for d := first; d <= last; d++ {
		m, err := s.Mark(0, "d", d)
		require.NoError(t, err)
		assert.Equal(t, m, ms[d-first], "Mark and Marks agree on day %d", d)
	}
	ms, err = s.Marks(0, "nobody", first, last)
	require.NoError(t, err)
	assert.Equal(t, []buckets.Ticks{-1, -1, -1, -1, -1}, ms)
}

// TestScanGivesEachBucketValuesOfItsOwn: buckets share the decoder's
// slabs, so a bucket's Values must end where the next one's begin
// (appending to one leaves the next as it was), names are shared
// strings however they change from bucket to bucket, and a long scan
// allocates a few slabs rather than one per record.
func TestScanGivesEachBucketValuesOfItsOwn(t *testing.T) {
	ctx := context.Background()
	s := newTestSet(t, t.TempDir(), Level{Interval: time.Hour, Retention: Year})
	day0 := buckets.DayOfTime(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC))
	names := [][]string{{"a", "b"}, {"b", "c", "d"}, {"a", "b"}}
	var want []Bucket
	for d := day0; d < day0+30; d++ {
		var bs []Bucket
		for h := range 24 {
			k := d.Start() + buckets.Ticks(h)*windowTicks
			b := Bucket{Start: k}
			for _, n := range names[(int(d-day0)*24+h)%len(names)] {
				b.Values = append(b.Values, buckets.NamedSummary{Name: n, Summary: buckets.Summary{Count: 1, Sum: float64(h), Min: float64(h), Max: float64(h), First: float64(h), Last: float64(h), FirstTicks: k, LastTicks: k}})
			}
			bs = append(bs, b)
		}
		require.NoError(t, s.Put(ctx, 0, "d", d.Start(), d.End(), bs, d.End()))
		want = append(want, bs...)
	}
	var got []Bucket
	scan := func() {
		got = got[:0]
		require.NoError(t, s.Scan(ctx, 0, "d", day0.Start(), (day0+30).Start(), func(b Bucket) error { got = append(got, b); return nil }))
	}
	scan()
	require.Equal(t, want, got)
	for i := range got {
		assert.Equal(t, len(got[i].Values), cap(got[i].Values), "bucket %d", i)
	}
	got[0].Values = append(got[0].Values, buckets.NamedSummary{Name: "zz"})
	assert.Equal(t, want[1], got[1], "appending to a bucket's values leaves the next bucket alone")
	assert.Equal(t, unsafe.StringData(got[0].Values[0].Name), unsafe.StringData(got[len(got)-1].Values[0].Name), "names interned")

	// Decoding the month's records: the slab for the first record,
	// then one for the rest, the names and the decoder's own state.
	l := Level{Interval: time.Hour, Retention: Year}
	var recs [][]byte
	for d := range 30 {
		recs = append(recs, appendRecord(nil, (day0+buckets.Day(d)).Start(), l.ticks(), want[d*24:(d+1)*24]))
	}
	allocs := testing.AllocsPerRun(5, func() {
		dec := &decoder{lo: day0.Start(), hi: (day0 + 30).Start()}
		for d, v := range recs {
			require.NoError(t, decodeRecord(v, (day0+buckets.Day(d)).Start(), l.ticks(), l.span(), dec, func(Bucket) error { return nil }))
		}
	})
	assert.LessOrEqual(t, allocs, float64(10), "a month of daily records allocates a few slabs, not one per record")
}

// TestScanNamesKeepsOnlyTheNamesAskedFor: a scan narrowed to names
// gives each bucket only those, in the record's order, leaves out the
// buckets that have none of them, and gives each bucket values of its
// own.
func TestScanNamesKeepsOnlyTheNamesAskedFor(t *testing.T) {
	ctx := context.Background()
	s := newTestSet(t, t.TempDir(), Level{Interval: time.Hour, Retention: Year})
	day0 := buckets.DayOfTime(time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC))
	names := [][]string{{"a", "b"}, {"c", "d"}, {"b", "c", "d"}}
	want := map[string]bool{"b": true, "d": true}
	var expect []Bucket
	for d := day0; d < day0+3; d++ {
		var bs []Bucket
		for h := range 24 {
			k := d.Start() + buckets.Ticks(h)*windowTicks
			b, kept := Bucket{Start: k}, Bucket{Start: k}
			for _, n := range names[(int(d-day0)*24+h)%len(names)] {
				v := buckets.NamedSummary{Name: n, Summary: buckets.Summary{Count: 1, Sum: float64(h), Min: float64(h), Max: float64(h), First: float64(h), Last: float64(h), FirstTicks: k, LastTicks: k}}
				b.Values = append(b.Values, v)
				if want[n] {
					kept.Values = append(kept.Values, v)
				}
			}
			bs = append(bs, b)
			expect = append(expect, kept)
		}
		require.NoError(t, s.Put(ctx, 0, "d", d.Start(), d.End(), bs, d.End()))
	}
	var got []Bucket
	require.NoError(t, s.ScanNames(ctx, 0, "d", day0.Start(), (day0+3).Start(), want, func(b Bucket) error { got = append(got, b); return nil }))
	require.Equal(t, expect, got)
	for i := range got {
		assert.Equal(t, len(got[i].Values), cap(got[i].Values), "bucket %d", i)
	}

	got = got[:0]
	require.NoError(t, s.ScanNames(ctx, 0, "d", day0.Start(), (day0+3).Start(), map[string]bool{"a": true}, func(b Bucket) error { got = append(got, b); return nil }))
	require.Len(t, got, 24, "only the buckets holding a (every third hour)")
	for _, b := range got {
		require.Len(t, b.Values, 1)
		assert.Equal(t, "a", b.Values[0].Name)
	}
}
