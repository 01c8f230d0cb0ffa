package store

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// baseTime is "now" in tests: noon, so a few hours either way stay in
// the same day.
var baseTime = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// today is the day of baseTime.
var today = buckets.DayOfTime(baseTime)

// testClock is a settable clock.
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock { return &testClock{t: baseTime} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testStore is a Store on a temp dir with a settable clock.
type testStore struct {
	*Store
	dir   string
	clock *testClock
	opts  Options
}

// newTestStore opens a store in a fresh temp dir. opts may adjust the
// options before Open.
func newTestStore(t *testing.T, opts ...func(*Options)) *testStore {
	t.Helper()
	return openTestStore(t, t.TempDir(), newTestClock(), opts...)
}

// openTestStore opens a store in dir and closes it at the end of the test.
func openTestStore(t testing.TB, dir string, clock *testClock, opts ...func(*Options)) *testStore {
	t.Helper()
	o := DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = clock.Now
	for _, f := range opts {
		f(&o)
	}
	s, err := Open(context.Background(), dir, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return &testStore{Store: s, dir: dir, clock: clock, opts: o}
}

// reopen closes ts and opens a new store on the same dir and clock.
func (ts *testStore) reopen(t testing.TB, opts ...func(*Options)) *testStore {
	t.Helper()
	require.NoError(t, ts.Close())
	return openTestStore(t, ts.dir, ts.clock, append([]func(*Options){func(o *Options) { *o = ts.opts }}, opts...)...)
}

// at is the tick of baseTime moved by d.
func at(d time.Duration) buckets.Ticks { return buckets.MustTicks(baseTime.Add(d)) }

// dayTick is the tick of day d plus offset.
func dayTick(d buckets.Day, offset time.Duration) buckets.Ticks {
	return d.Start() + buckets.Ticks(offset/100)
}

// reading builds a reading with values in name order.
func reading(dev string, k buckets.Ticks, kv ...any) buckets.Reading {
	r := buckets.Reading{Device: buckets.DeviceID(dev), Ticks: k}
	for i := 0; i < len(kv); i += 2 {
		var v buckets.Value
		switch x := kv[i+1].(type) {
		case float64:
			v = buckets.Float(x)
		case int:
			v = buckets.Int(int64(x))
		case int64:
			v = buckets.Int(x)
		case bool:
			v = buckets.Bool(x)
		case string:
			v = buckets.String(x)
		default:
			panic(fmt.Sprintf("unsupported value %T", x))
		}
		r.Values = append(r.Values, buckets.Field{Name: kv[i].(string), Value: v})
	}
	if _, ok := buckets.SortValues(r.Values); !ok {
		panic("duplicate value name")
	}
	return r
}

// series returns n readings of dev, one per step starting at k0, each
// with value "n" = its index.
func series(dev string, k0 buckets.Ticks, step time.Duration, n int) []buckets.Reading {
	rs := make([]buckets.Reading, n)
	for i := range rs {
		rs[i] = reading(dev, k0+buckets.Ticks(i)*buckets.Ticks(step/100), "n", i)
	}
	return rs
}

// write writes rs and fails the test on error.
func (ts *testStore) write(t *testing.T, rs ...buckets.Reading) {
	t.Helper()
	require.NoError(t, ts.Write(context.Background(), rs))
}

// ticksOf lists the ticks of rs.
func ticksOf(rs []buckets.Reading) []buckets.Ticks {
	out := make([]buckets.Ticks, len(rs))
	for i, r := range rs {
		out[i] = r.Ticks
	}
	return out
}

// isOpen reports whether the table of day is open.
func (ts *testStore) isOpen(day buckets.Day) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[day]
	return t != nil && t.staysOpen()
}

// reopening reports whether the table of day has a new handle that
// waits for the open one to end.
func (ts *testStore) reopening(day buckets.Day) bool {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t := ts.tables[day]
	return t != nil && t.cur != nil && t.live != nil && t.cur != t.live
}

// openCold counts open tables of days that are not hot.
func (ts *testStore) openCold() int {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	n := 0
	for d, t := range ts.tables {
		if t.staysOpen() && !ts.isHot(d) {
			n++
		}
	}
	return n
}
