// Package storetest opens stores for the tests of the packages beside
// store (such as backup and repair), which see the store only through
// its exported methods: a store on a temporary directory with a
// settable clock, closed when the test ends, and readings to write
// into it.
package storetest

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
	"github.com/telemetryd/telemetryd/store"
)

// BaseTime is "now" in tests: noon, so a few hours either way stay in
// the same day.
var BaseTime = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// Today is the day of BaseTime.
var Today = buckets.DayOfTime(BaseTime)

// Clock is a settable clock, starting at BaseTime.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock at BaseTime.
func NewClock() *Clock { return &Clock{t: BaseTime} }

// Now is the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// Store is a store on a temporary directory with a settable clock.
type Store struct {
	*store.Store
	Dir   string
	Clock *Clock
	Opts  store.Options
}

// New opens a store in a fresh temporary directory. opts may adjust
// the options before Open.
func New(t *testing.T, opts ...func(*store.Options)) *Store {
	t.Helper()
	return Open(t, t.TempDir(), NewClock(), opts...)
}

// Open opens a store in dir and closes it at the end of the test.
func Open(t testing.TB, dir string, clock *Clock, opts ...func(*store.Options)) *Store {
	t.Helper()
	o := store.DefaultOptions()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	o.Now = clock.Now
	for _, f := range opts {
		f(&o)
	}
	s, err := store.Open(context.Background(), dir, o)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return &Store{Store: s, Dir: dir, Clock: clock, Opts: o}
}

// Reopen closes s and opens a new store on the same directory and
// clock.
func (s *Store) Reopen(t testing.TB, opts ...func(*store.Options)) *Store {
	t.Helper()
	require.NoError(t, s.Close())
	return Open(t, s.Dir, s.Clock, append([]func(*store.Options){func(o *store.Options) { *o = s.Opts }}, opts...)...)
}

// MustWrite writes rs and fails the test on error.
func (s *Store) MustWrite(t *testing.T, rs ...buckets.Reading) {
	t.Helper()
	require.NoError(t, s.Write(context.Background(), rs))
}

// At is the tick of BaseTime moved by d.
func At(d time.Duration) buckets.Ticks { return buckets.MustTicks(BaseTime.Add(d)) }

// DayTick is the tick of day d plus offset.
func DayTick(d buckets.Day, offset time.Duration) buckets.Ticks {
	return d.Start() + buckets.Ticks(offset/100)
}

// Reading builds a reading of dev at k with values in name order:
// kv alternates names and values (float64, int, int64, bool, string).
func Reading(dev string, k buckets.Ticks, kv ...any) buckets.Reading {
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

// Series returns n readings of dev, one per step starting at k0, each
// with value "n" = its index.
func Series(dev string, k0 buckets.Ticks, step time.Duration, n int) []buckets.Reading {
	rs := make([]buckets.Reading, n)
	for i := range rs {
		rs[i] = Reading(dev, k0+buckets.Ticks(i)*buckets.Ticks(step/100), "n", i)
	}
	return rs
}
