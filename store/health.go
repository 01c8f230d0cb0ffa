package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/diskuse"
)

// A day table that cannot commit — its files are damaged so it does not
// open, or its commits fail (a read-only or full file system) — is
// blocked: CommitBlocked names it and why, for readiness and for the
// ingester, which holds the messages in the stream (unacked) instead of
// acking what cannot be stored. The store logs one line when a table
// becomes blocked and one when it commits again, and exports the number
// of blocked tables as telemetry.store.blocked_tables by reason.
//
// A blocked table is tried again by CommitBlocked itself, at most every
// probeEvery: a damaged one is opened again, one whose commits failed
// commits a one-key transaction. So a table whose cause went away (the
// disk was freed, the file system remounted writable) is unblocked
// without any message being delivered for it. A damaged table stays
// blocked until it is repaired (Repair) or dropped (DropTable).

// probeEvery is how often CommitBlocked tries a blocked table again.
const probeEvery = 2 * time.Second

// Reasons a table is blocked, the reason attribute of the gauge.
const (
	blockedDamaged = "damaged"       // the table does not open
	blockedCommit  = "commit_failed" // its commits fail
	// blockedRepairing: RepairTable is rebuilding it; it is not probed.
	blockedRepairing = "repairing"
)

// blockedTable is why one table cannot commit.
type blockedTable struct {
	reason string
	err    error
	since  time.Time
	probed time.Time
}

// commitHealth is the set of blocked tables.
type commitHealth struct {
	mu      sync.Mutex
	blocked map[buckets.Day]*blockedTable
}

// block marks day blocked for reason and logs it when that is news.
func (s *Store) block(day buckets.Day, reason string, err error) {
	h := &s.health
	h.mu.Lock()
	if h.blocked == nil {
		h.blocked = make(map[buckets.Day]*blockedTable)
	}
	b, was := h.blocked[day]
	now := time.Now()
	if !was || b.reason != reason {
		h.blocked[day] = &blockedTable{reason: reason, err: err, since: now, probed: now}
	} else {
		b.err, b.probed = err, now
	}
	h.mu.Unlock()
	if was && b.reason == reason {
		return
	}
	if reason == blockedRepairing {
		return // RepairTable logs
	}
	if reason == blockedDamaged {
		s.log.Error("day table cannot be opened (damaged?); its readings wait unacked in the stream and queries of the day fail: "+repairAdvice(day),
			"day", day.String(), "err", err)
		return
	}
	s.log.Error("day table cannot commit; its readings wait unacked in the stream and are committed once it can",
		"day", day.String(), "err", err)
}

// unblock clears day, logging when it was blocked.
func (s *Store) unblock(day buckets.Day, why string) {
	h := &s.health
	h.mu.Lock()
	b, was := h.blocked[day]
	delete(h.blocked, day)
	h.mu.Unlock()
	if was {
		s.log.Info("day table can commit again", "day", day.String(), "was", b.reason, "how", why,
			"blocked_for", time.Since(b.since).Round(time.Millisecond).String())
	}
}

// blockedTables counts the blocked tables by reason (for the gauge).
func (s *Store) blockedTables() map[string]int64 {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int64{blockedDamaged: 0, blockedCommit: 0, blockedRepairing: 0}
	for _, b := range h.blocked {
		n[b.reason]++
	}
	return n
}

// repairAdvice names the two ways out for a damaged table.
func repairAdvice(day buckets.Day) string {
	d := day.String()
	return "repair it (telemetryd repair -day " + d + ", or POST /v1/tables/" + d + "/repair) or drop it (DELETE /v1/tables/" + d +
		"; the stream's readings of the day go into the new table)"
}

// BlockedError says which day tables cannot commit and why.
type BlockedError struct {
	Days    []buckets.Day
	Reasons []string // one per day, client-safe
}

// Error implements error.
func (e *BlockedError) Error() string {
	parts := make([]string, len(e.Days))
	for i, d := range e.Days {
		parts[i] = "table " + d.String() + " " + e.Reasons[i]
	}
	return "store cannot commit: " + strings.Join(parts, "; ")
}

// Unwrap makes it match buckets.ErrUnavailable.
func (e *BlockedError) Unwrap() error { return buckets.ErrUnavailable }

// CommitBlocked returns a *BlockedError naming the day tables that
// cannot commit, or nil. It first tries again each blocked table not
// tried within probeEvery, so it unblocks by itself a table whose cause
// went away.
func (s *Store) CommitBlocked(ctx context.Context) error {
	h := &s.health
	h.mu.Lock()
	var due []buckets.Day
	now := time.Now()
	for d, b := range h.blocked {
		if b.reason != blockedRepairing && now.Sub(b.probed) >= probeEvery {
			b.probed = now
			due = append(due, d)
		}
	}
	h.mu.Unlock()
	for _, d := range due {
		s.probe(ctx, d)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.blocked) == 0 {
		return nil
	}
	e := &BlockedError{Days: slices.Sorted(maps.Keys(h.blocked))}
	for _, d := range e.Days {
		b := h.blocked[d]
		switch b.reason {
		case blockedDamaged:
			e.Reasons = append(e.Reasons, "cannot be opened (damaged?): "+repairAdvice(d))
		case blockedRepairing:
			e.Reasons = append(e.Reasons, "is being repaired")
		default:
			e.Reasons = append(e.Reasons, "cannot commit: "+firstLine(b.err.Error()))
		}
	}
	return e
}

// probe tries the blocked table of day again: it opens it for writing
// and commits a one-key transaction. Success unblocks it.
func (s *Store) probe(ctx context.Context, day buckets.Day) {
	if s.diskTight(false) {
		return // a probe's commit could write into a memtable log's hole
	}
	s.mu.Lock()
	if t := s.tables[day]; t != nil && t.failErr != nil {
		t.failedAt = time.Time{} // open it again now
	}
	s.mu.Unlock()
	t, err := s.acquire(ctx, day, forWrite)
	if err != nil {
		return // openHandle blocked it again (or a drop is under way)
	}
	defer s.release(t)
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if err := probeCommit(t); err != nil {
		s.block(day, blockedCommit, err)
		return
	}
	s.unblock(day, "tried again")
}

// probeCommit commits the table's format key, unchanged: a commit that
// writes to the table's files. It runs under writeMu.
func probeCommit(t *table) error {
	version := t.reserveVersion()
	txn := t.writeTxn()
	defer txn.Discard()
	if err := txn.Set(metaFormatKey, []byte{formatVersion}); err != nil {
		return err
	}
	if err := t.commitTxnAt(txn, version); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	t.formatSaved = true
	return nil
}

// noteCommit records the outcome of a commit to the table of day: a
// failure of the files blocks it, a success unblocks it.
func (s *Store) noteCommit(day buckets.Day, err error) {
	switch {
	case err == nil:
		if s.isBlocked(day) && !s.isBlockedFor(day, blockedRepairing) {
			s.unblock(day, "committed")
		}
	case errors.Is(err, badger.ErrBlockedWrites), errors.Is(err, badger.ErrDBClosed),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		// the table is being closed or dropped, or the caller gave up
	case s.isBlockedFor(day, blockedRepairing):
		// RepairTable reports its own failures
	default:
		s.block(day, blockedCommit, err)
	}
}

// isBlocked reports whether day is blocked.
func (s *Store) isBlocked(day buckets.Day) bool {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.blocked[day]
	return ok
}

// blockedState returns a copy of why day is blocked, nil if it is not.
func (s *Store) blockedState(day buckets.Day) *blockedTable {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if b, ok := h.blocked[day]; ok {
		c := *b
		return &c
	}
	return nil
}

// restoreBlocked puts back the blocked state b of day.
func (s *Store) restoreBlocked(day buckets.Day, b *blockedTable) {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	h.blocked[day] = b
}

// isBlockedFor reports whether day is blocked for reason.
func (s *Store) isBlockedFor(day buckets.Day, reason string) bool {
	h := &s.health
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.blocked[day]
	return ok && b.reason == reason
}

// diskFloor is the free space, beyond what the memtable logs may still
// claim, below which the store writes nothing.
const diskFloor = 16 << 20

// errDiskTight refuses a write while the disk is tight (diskTight).
var errDiskTight = errors.New("disk full: the free space is below what the memtable logs may still claim")

// diskTight reports whether the data dir's file system has less free
// space than its memtable logs may still claim (measured again when
// remeasure is set, else as last measured) plus diskFloor. Badger
// writes them through a memory map, and a write into one of their holes
// on a full file system is no error but a SIGBUS that ends the process
// (diskuse.Unallocated). Intake pauses well before (the ingester's
// disk reserve); Write and the compactor check it as a last guard. A
// file system filled to its last byte while a commit is under way can
// still end the process: only the reserve keeps the service from that
// edge.
func (s *Store) diskTight(remeasure bool) bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.dir, &st); err != nil {
		return false
	}
	if remeasure {
		s.holes.Store(diskuse.Unallocated(s.dir, "nats"))
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	return free < diskFloor+s.holes.Load()
}

// registerHealthGauge exports the blocked tables by reason.
func (s *Store) registerHealthGauge(meter metric.Meter) (metric.Registration, error) {
	g, err := meter.Int64ObservableGauge("telemetry.store.blocked_tables",
		metric.WithDescription("Day tables that cannot commit, by reason (damaged: does not open; commit_failed: its commits fail; repairing). Their readings wait unacked in the stream."),
		metric.WithUnit("{table}"))
	if err != nil {
		return nil, fmt.Errorf("blocked tables gauge: %w", err)
	}
	return meter.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for reason, n := range s.blockedTables() {
			o.ObserveInt64(g, n, metric.WithAttributes(attribute.String("reason", reason)))
		}
		return nil
	}, g)
}
