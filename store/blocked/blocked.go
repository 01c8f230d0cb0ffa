// Package blocked keeps the day tables that cannot commit and why: a
// table whose files are damaged so it does not open, one whose commits
// fail (a read-only or full file system), and one being repaired. The
// store marks and clears them, tries them again (Due), and reports them
// to readiness and to the ingester as an *Error.
package blocked

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// Reasons a table is blocked, the reason attribute of the store's
// blocked tables gauge.
const (
	Damaged = "damaged"       // the table does not open
	Commit  = "commit_failed" // its commits fail
	// Repairing: the table is being rebuilt; it is not tried again.
	Repairing = "repairing"
)

// Table is why one table cannot commit.
type Table struct {
	Reason string
	Err    error
	Since  time.Time // when it was blocked for Reason
	Probed time.Time // when it was last tried
}

// Set is the set of blocked tables. The zero value is empty and ready.
type Set struct {
	mu      sync.Mutex
	blocked map[buckets.Day]*Table
}

// Block marks day blocked for reason at now and reports whether that is
// news (it was not blocked, or for another reason); otherwise it notes
// err as the latest failure and now as the latest try.
func (h *Set) Block(day buckets.Day, reason string, err error, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.blocked == nil {
		h.blocked = make(map[buckets.Day]*Table)
	}
	b, was := h.blocked[day]
	if was && b.Reason == reason {
		b.Err, b.Probed = err, now
		return false
	}
	h.blocked[day] = &Table{Reason: reason, Err: err, Since: now, Probed: now}
	return true
}

// Mark blocks day for reason, at the wall clock's now, and logs that to
// log when it is news: one line when a table becomes blocked, none for
// Repairing (the repair logs its own).
func (h *Set) Mark(log *slog.Logger, day buckets.Day, reason string, err error) {
	if !h.Block(day, reason, err, time.Now()) || reason == Repairing {
		return
	}
	if reason == Damaged {
		log.Error("day table cannot be opened (damaged?); its readings wait unacked in the stream and queries of the day fail: "+RepairAdvice(day),
			"day", day.String(), "err", err)
		return
	}
	log.Error("day table cannot commit; its readings wait unacked in the stream and are committed once it can",
		"day", day.String(), "err", err)
}

// Clear unblocks day and logs that to log when it was blocked; why says
// how it came free.
func (h *Set) Clear(log *slog.Logger, day buckets.Day, why string) {
	if b := h.Unblock(day); b != nil {
		log.Info("day table can commit again", "day", day.String(), "was", b.Reason, "how", why,
			"blocked_for", time.Since(b.Since).Round(time.Millisecond).String())
	}
}

// NoteCommit records the outcome err of a commit to the table of day,
// logging to log what changes: a failure of the files blocks it, a
// success unblocks it. A table being closed or dropped, a caller that
// gave up, and a table being repaired (whose repair reports its own
// failures) change nothing.
func (h *Set) NoteCommit(log *slog.Logger, day buckets.Day, err error) {
	switch {
	case err == nil:
		if h.Is(day) && !h.IsFor(day, Repairing) {
			h.Clear(log, day, "committed")
		}
	case errors.Is(err, badger.ErrBlockedWrites), errors.Is(err, badger.ErrDBClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// the table is being closed or dropped, or the caller gave up
	case h.IsFor(day, Repairing):
		// the repair reports its own failures
	default:
		h.Mark(log, day, Commit, err)
	}
}

// Unblock clears day and returns why it was blocked, nil if it was not.
func (h *Set) Unblock(day buckets.Day) *Table {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.blocked[day]
	delete(h.blocked, day)
	return b
}

// Counts counts the blocked tables by reason, every reason present.
func (h *Set) Counts() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int64{Damaged: 0, Commit: 0, Repairing: 0}
	for _, b := range h.blocked {
		n[b.Reason]++
	}
	return n
}

// Due returns the blocked tables not being repaired that were last
// tried at least every ago, and notes now as their latest try.
func (h *Set) Due(now time.Time, every time.Duration) []buckets.Day {
	h.mu.Lock()
	defer h.mu.Unlock()
	var due []buckets.Day
	for d, b := range h.blocked {
		if b.Reason != Repairing && now.Sub(b.Probed) >= every {
			b.Probed = now
			due = append(due, d)
		}
	}
	return due
}

// Err returns an *Error naming the blocked tables, or nil.
func (h *Set) Err() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.blocked) == 0 {
		return nil
	}
	e := &Error{Days: slices.Sorted(maps.Keys(h.blocked))}
	for _, d := range e.Days {
		b := h.blocked[d]
		switch b.Reason {
		case Damaged:
			e.Reasons = append(e.Reasons, "cannot be opened (damaged?): "+RepairAdvice(d))
		case Repairing:
			e.Reasons = append(e.Reasons, "is being repaired")
		default:
			e.Reasons = append(e.Reasons, "cannot commit: "+FirstLine(b.Err.Error()))
		}
	}
	return e
}

// Is reports whether day is blocked.
func (h *Set) Is(day buckets.Day) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.blocked[day]
	return ok
}

// IsFor reports whether day is blocked for reason.
func (h *Set) IsFor(day buckets.Day, reason string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.blocked[day]
	return ok && b.Reason == reason
}

// Get returns a copy of why day is blocked, nil if it is not.
func (h *Set) Get(day buckets.Day) *Table {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b, ok := h.blocked[day]; ok {
		c := *b
		return &c
	}
	return nil
}

// Restore puts back the state b of day (as Get returned it).
func (h *Set) Restore(day buckets.Day, b *Table) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.blocked[day] = b
}

// RepairAdvice names the two ways out for a damaged table.
func RepairAdvice(day buckets.Day) string {
	d := day.String()
	return "repair it (telemetryd repair -day " + d + ", or POST /v1/tables/" + d + "/repair) or drop it (DELETE /v1/tables/" + d +
		"; the stream's readings of the day go into the new table)"
}

// Error says which day tables cannot commit and why.
type Error struct {
	Days    []buckets.Day
	Reasons []string // one per day, client-safe
}

// Error implements error.
func (e *Error) Error() string {
	parts := make([]string, len(e.Days))
	for i, d := range e.Days {
		parts[i] = "table " + d.String() + " " + e.Reasons[i]
	}
	return "store cannot commit: " + strings.Join(parts, "; ")
}

// Unwrap makes it match buckets.ErrUnavailable.
func (e *Error) Unwrap() error { return buckets.ErrUnavailable }

// FirstLine trims an error or panic message to its first non-empty
// line, as a blocked table's reason shows it.
func FirstLine(s string) string {
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "==") {
			return line
		}
	}
	return s
}
