package store

import (
	"context"
	"errors"

	"github.com/telemetryd/telemetryd/buckets"
)

// Reads never write. A query takes a reference to a day table's open
// database, reads, and gives the reference up; nothing on its way
// compacts, writes rollups, commits to Badger or saves a count file,
// and it never waits for any of that either. What a table needs before
// it may be closed (a full merge of its open blocks, the rollups that
// merge puts, its count file) is settling it, and only the compactor
// settles:
//
//   - a table is settled when closing it now would leave nothing of
//     ours undone: the compactor merged every device's open blocks and
//     saved the count file since the last commit (a commit unsettles
//     it). A table of a read-only store is always settled;
//   - the idle sweep (closeIdle) closes only settled tables; an idle
//     table that is not settled is handed to the compactor's queue
//     instead, and stays open, shared by every reader that comes, while
//     the compactor settles it (a reader holding it meanwhile is served
//     as usual); the compactor then sweeps again, which closes it;
//   - the queue holds each day once (a day queued again joins the job
//     already there) and at most maxSettleJobs days: past that the
//     sweep's hand-over is refused and made again by the next sweep;
//   - whoever gives up a handle's last reference (a reader, after a
//     drop or a writer detached the handle) does not close its database
//     itself: the close runs on a goroutine of its own, which the drop
//     or the writer waits for as before.
//
// The count file is written by the compactor only: when it settles a
// table, and for an open table that went quiet (saveQuietCounts);
// Close writes the counts of the tables it closes after closing them.
// The crash rules of package countfile are unchanged: a count file is
// written only under writeMu between commits and removed before the
// next one.

// maxSettleJobs bounds the days waiting in the compactor's queue
// (package settlequeue). A variable so that tests can reach it.
var maxSettleJobs = 1024

// settleQueued settles the queued days, then sweeps the idle tables
// again, which closes those now settled. It runs on the compactor's
// goroutine; a job left when the store closes is Close's (compactAll).
func (s *Store) settleQueued() {
	jobs := s.settles.Take()
	for _, j := range jobs {
		if !s.stopping() {
			s.settle(j.Day)
		}
		j.Finish()
	}
	if len(jobs) > 0 && !s.stopping() {
		s.closeIdle()
	}
}

// settle merges every device's open blocks of the open table of day
// (when it is writable and the disk has room) and saves its count
// file, and marks it settled unless a commit came meanwhile. A merge
// that fails is logged and settles the table anyway, as a close did
// before: readers merge open blocks themselves, and the next opening
// lists them again. It runs on the compactor's goroutine.
func (s *Store) settle(day buckets.Day) {
	s.mu.Lock()
	t := s.tables[day]
	held := t != nil && s.holdLive(t)
	s.mu.Unlock()
	if !held {
		return // closed, dropped or never opened: nothing to settle
	}
	defer s.unhold(t)
	if t.settled.Load() {
		return
	}
	t.writeMu.Lock()
	commits := t.commits
	t.writeMu.Unlock()
	if !t.readOnly && !s.diskTight(false) { // the holes as the compactor last measured them
		if err := s.compactTable(t, true); err != nil && !errors.Is(err, errStopping) {
			s.log.Error("compact table before closing it", "day", day.String(), "err", err)
		}
	}
	t.writeMu.Lock()
	defer t.writeMu.Unlock()
	if t.commits != commits {
		return // written meanwhile: the next sweep hands it over again
	}
	s.saveCount(t)
	t.settled.Store(true)
}

// settleNow queues day and waits until the compactor tried to settle
// it, or ctx or the store ends. A full queue returns at once: the
// sweep hands the table over again when it is idle.
func (s *Store) settleNow(ctx context.Context, day buckets.Day) error {
	j := s.settles.Add(day)
	if j == nil {
		return nil
	}
	select {
	case <-j.Done():
		return nil
	case <-s.stop:
		return errClosed
	case <-ctx.Done():
		return ctx.Err()
	}
}
