package store

import (
	"context"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/blocked"
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

// BlockedError says which day tables cannot commit and why.
type BlockedError = blocked.Error

// CommitBlocked returns a *BlockedError naming the day tables that
// cannot commit, or nil. It first tries again each blocked table not
// tried within probeEvery, so it unblocks by itself a table whose cause
// went away.
func (s *Store) CommitBlocked(ctx context.Context) error {
	for _, d := range s.health.Due(time.Now(), probeEvery) {
		s.probe(ctx, d)
	}
	return s.health.Err()
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
		s.health.Mark(s.log, day, blocked.Commit, err)
		return
	}
	s.health.Clear(s.log, day, "tried again")
}

// probeCommit commits the table's format key, unchanged: a commit that
// writes to the table's files. It runs under writeMu.
func probeCommit(t *table) error {
	version := t.ver.Reserve(t.db)
	txn := t.ver.WriteTxn(t.db)
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
