// Package rollup keeps per-device summaries of readings at coarse
// intervals (rollups) in Badger databases of their own, one per level
// and UTC month, so that they outlive the day tables they were made
// from and are dropped on their own clock. A rollup bucket holds, per
// numeric value name, what an aggregate bucket of the same interval
// holds: count, sum, min, max, first and last (buckets.Summary).
//
// The store computes the buckets (with the arithmetic of its aggregate
// reads) as its compactor merges readings; this package encodes,
// stores, reads and drops them. Its formats are private to it; the
// store's README describes them.
package rollup

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// Window is the span of time a rollup is computed for at once: the
// store's seal window, one hour aligned to the Unix epoch. Every level's
// interval divides it, so a window holds whole buckets of every level.
const Window = time.Hour

// windowTicks is Window in ticks.
const windowTicks = buckets.Ticks(Window / 100)

// Limits of a level.
const (
	MinInterval = time.Second
	MaxLevels   = 8
)

// Level is one rollup: buckets of Interval kept for Retention.
type Level struct {
	Interval  time.Duration
	Retention time.Duration
}

// String is the level as ParseLevels reads it, e.g. "1m:90d".
func (l Level) String() string { return FormatDuration(l.Interval) + ":" + FormatDuration(l.Retention) }

// Name is the level's directory name: its interval, e.g. "1m".
func (l Level) Name() string { return FormatDuration(l.Interval) }

// ticks is the interval in ticks.
func (l Level) ticks() buckets.Ticks { return buckets.Ticks(l.Interval / 100) }

// Validate checks one level: an interval of at least a second that
// divides an hour (so buckets never straddle the windows rollups are
// computed in), and a retention of at least one interval.
func (l Level) Validate() error {
	switch {
	case l.Interval < MinInterval:
		return fmt.Errorf("rollup interval %s: must be at least %s", l.Interval, MinInterval)
	case l.Interval%time.Second != 0:
		return fmt.Errorf("rollup interval %s: must be a whole number of seconds", l.Interval)
	case Window%l.Interval != 0:
		return fmt.Errorf("rollup interval %s: must divide one hour (1s, 30s, 1m, 5m, 15m, 1h, ...)", FormatDuration(l.Interval))
	case l.Retention < l.Interval:
		return fmt.Errorf("rollup %s: retention %s is shorter than the interval", l, FormatDuration(l.Retention))
	}
	return nil
}

// ValidateLevels checks every level and that no interval repeats. An
// empty list (rollups off) is valid.
func ValidateLevels(ls []Level) error {
	if len(ls) > MaxLevels {
		return fmt.Errorf("rollups: %d levels, at most %d", len(ls), MaxLevels)
	}
	seen := make(map[time.Duration]bool, len(ls))
	for _, l := range ls {
		if err := l.Validate(); err != nil {
			return err
		}
		if seen[l.Interval] {
			return fmt.Errorf("rollup interval %s: given twice", FormatDuration(l.Interval))
		}
		seen[l.Interval] = true
	}
	return nil
}

// ParseLevels reads a comma-separated list of interval:retention, such
// as "1m:90d,1h:3y". Durations are Go durations or a whole number of
// days (d), weeks (w) or 365-day years (y). The levels come back
// sorted by interval; an empty string is no levels (rollups off).
func ParseLevels(s string) ([]Level, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, nil
	}
	var ls []Level
	for part := range strings.SplitSeq(s, ",") {
		iv, ret, ok := strings.Cut(strings.TrimSpace(part), ":")
		if !ok {
			return nil, fmt.Errorf("rollup %q: want interval:retention, such as 1h:3y", part)
		}
		i, err := ParseDuration(iv)
		if err != nil {
			return nil, fmt.Errorf("rollup %q: interval: %w", part, err)
		}
		r, err := ParseDuration(ret)
		if err != nil {
			return nil, fmt.Errorf("rollup %q: retention: %w", part, err)
		}
		ls = append(ls, Level{Interval: i, Retention: r})
	}
	slices.SortFunc(ls, func(a, b Level) int { return int(a.Interval - b.Interval) })
	if err := ValidateLevels(ls); err != nil {
		return nil, err
	}
	return ls, nil
}

// Units beyond Go's durations.
const (
	Day  = 24 * time.Hour
	Week = 7 * Day
	Year = 365 * Day
)

// ParseDuration reads a Go duration or a whole number of days (d),
// weeks (w) or 365-day years (y).
func ParseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, errors.New("empty duration")
	}
	unit := map[byte]time.Duration{'d': Day, 'w': Week, 'y': Year}[s[len(s)-1]]
	if unit == 0 {
		d, err := time.ParseDuration(s)
		if err != nil {
			return 0, fmt.Errorf("%q: want a duration such as 90s, 1m, 1h, 90d, 3y", s)
		}
		return d, nil
	}
	n, err := strconv.ParseInt(s[:len(s)-1], 10, 64)
	if err != nil || n <= 0 || n > int64(200*Year/unit) {
		return 0, fmt.Errorf("%q: want a positive whole number before %q", s, s[len(s)-1:])
	}
	return time.Duration(n) * unit, nil
}

// FormatDuration writes d in the largest of y, d, h, m, s that divides
// it (ParseDuration reads it back), else as Go does.
func FormatDuration(d time.Duration) string {
	for _, u := range []struct {
		d time.Duration
		s string
	}{{Year, "y"}, {Day, "d"}, {time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}} {
		if d > 0 && d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.s
		}
	}
	return d.String()
}

// For picks the level to answer buckets of interval (ticks) from: the
// one with the largest interval that divides it. ok is false when none
// does.
func For(ls []Level, interval buckets.Ticks) (i int, ok bool) {
	i = -1
	for j, l := range ls {
		if interval%l.ticks() == 0 && (i < 0 || l.Interval > ls[i].Interval) {
			i = j
		}
	}
	return i, i >= 0
}

// WindowStart is the start of the window holding k.
func WindowStart(k buckets.Ticks) buckets.Ticks { return k - k%windowTicks }

// span is the time one record of a level covers: the shortest of 1,
// 2, 3, 4, 6, 8, 12 and 24 hours that holds at least 24 buckets (a
// day for hourly buckets), so a long read walks few records and a write
// rewrites at most a day's worth of one level.
func (l Level) span() buckets.Ticks {
	for _, h := range []buckets.Ticks{1, 2, 3, 4, 6, 8, 12, 24} {
		if h*windowTicks/l.ticks() >= 24 {
			return h * windowTicks
		}
	}
	return 24 * windowTicks
}

// months is the length of the level's periods (one database each) in
// months: one below an hour, twelve (a UTC year) from an hour, so a
// year of hourly buckets lies in one or two databases.
func (l Level) months() int {
	if l.Interval < time.Hour {
		return 1
	}
	return 12
}

// periodOf is the first month of the level's period holding k.
func (l Level) periodOf(k buckets.Ticks) int {
	m := monthOf(k)
	return m - m%l.months()
}
