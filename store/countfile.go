package store

import (
	"time"

	"github.com/telemetryd/telemetryd/store/countfile"
)

// The reading count of a day table is kept in the table's metadata and
// in its count file (package countfile), which is valid exactly when it
// exists: written only under the table's writeMu when no commit can
// follow unnoticed, and removed (durably) before the next commit.

// countQuiet is how long an open table must go without a commit before
// the compactor writes its count file.
const countQuiet = time.Minute

// saveCount writes the count file of t if it is missing and the count
// is known. The caller holds t.writeMu and makes sure that no commit to
// t is under way (t is closed, or held and write-quiet).
func (s *Store) saveCount(t *table) {
	n := t.readings.Load()
	if s.opts.ReadOnly || t.countFile || n < 0 {
		return
	}
	if testHookTableWrite != nil {
		testHookTableWrite("count")
	}
	if err := countfile.Write(t.dir, n); err != nil {
		s.log.Warn("day table reading count not saved; it is reported as unknown after a restart until the table is opened",
			"day", t.day.String(), "err", err)
		return
	}
	t.countFile = true
}

// saveQuietCounts writes the count file of every open writable table
// that has not been written to for countQuiet, so that its count
// survives a crash. The next commit to the table removes the file
// again; a table that is busy writing is skipped. It runs on the
// compactor's goroutine.
func (s *Store) saveQuietCounts() {
	if s.opts.ReadOnly {
		return
	}
	now := s.now()
	s.mu.Lock()
	var held []*table
	for _, t := range s.tables {
		if s.holdOpen(t) { // keeps it from being closed or dropped; not a use
			held = append(held, t)
		}
	}
	s.mu.Unlock()
	for _, t := range held {
		if t.writeMu.TryLock() {
			if now.Sub(t.lastCommit) >= countQuiet {
				s.saveCount(t)
			}
			t.writeMu.Unlock()
		}
		s.unhold(t)
	}
}

// beforeCommit removes the count file of t, if there is one, before a
// commit to t, notes the time of the commit and unsettles t. The caller
// holds t.writeMu.
func (s *Store) beforeCommit(t *table) error {
	t.lastCommit = s.now()
	t.commits++
	t.settled.Store(false)
	if !t.countFile {
		return nil
	}
	if err := countfile.Remove(t.dir); err != nil {
		return err
	}
	t.countFile = false
	return nil
}
