package store

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// The reading count of a day table is kept twice: exactly, in the
// table's own metadata (metaReadingsKey, updated by every commit), and
// in a count file next to the Badger files, so that Tables can report
// it without opening the database. Opening a Badger database starts
// compactions of the files it was closed with, and closing it (as a
// drop does) waits for them, so listing the tables must not open them.
//
// The count file is valid exactly when it exists. It is written (to a
// temporary file that is synced and renamed over it, then the directory
// is synced) only under the table's writeMu, when no commit can follow
// unnoticed: by the compactor when it settles a table before an idle
// close (settle.go) and for an open table that nobody wrote to for
// countQuiet, and by Close after the table is closed cleanly. Before the next
// commit to the table it is removed, and the removal is synced, so a
// crash after a commit never leaves a stale count behind: such a table
// has no count file and its count is unknown (-1) until it is opened
// again.
//
// Badger ignores files it does not know (it reads MANIFEST and lists
// *.sst, *.vlog and *.mem files only), repair.CheckFiles reads *.sst
// files only, and discovery looks only at the names of table
// directories, so the file needs no special handling anywhere else.

// countFileName is the name of the count file in a table directory. It
// holds the number of readings in decimal followed by a newline.
const countFileName = "READINGS"

// countQuiet is how long an open table must go without a commit before
// the compactor writes its count file.
const countQuiet = time.Minute

// maxCountFileSize bounds what readCountFile reads: a count is at most
// 19 digits and a newline.
const maxCountFileSize = 20

// readCountFile returns the count in the count file of the table in
// dir; ok is false when there is none. A file that does not hold a
// count is an error.
func readCountFile(dir string) (n int64, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, countFileName))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read reading count: %w", err)
	}
	n, err = parseCount(b)
	if err != nil {
		return 0, false, fmt.Errorf("read reading count: %w", err)
	}
	return n, true, nil
}

// parseCount parses the contents of a count file: decimal digits and a
// newline, nothing else.
func parseCount(b []byte) (int64, error) {
	if len(b) < 2 || len(b) > maxCountFileSize || b[len(b)-1] != '\n' {
		return 0, fmt.Errorf("malformed count file (%d bytes)", len(b))
	}
	digits := b[:len(b)-1]
	for _, c := range digits {
		if c < '0' || c > '9' {
			return 0, errors.New("malformed count file")
		}
	}
	n, err := strconv.ParseInt(string(digits), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("malformed count file: %w", err)
	}
	return n, nil
}

// writeCountFile atomically replaces the count file of the table in dir
// with n, durably: the new file is synced before it is renamed into
// place and the directory is synced after.
func writeCountFile(dir string, n int64) error {
	tmp := filepath.Join(dir, countFileName+".tmp")
	err := writeSynced(tmp, []byte(strconv.FormatInt(n, 10)+"\n"))
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, countFileName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write reading count: %w", err)
	}
	return nil
}

// removeCountFile removes the count file of the table in dir, if any,
// and syncs the directory so that the removal is on disk before any
// commit that follows.
func removeCountFile(dir string) error {
	err := os.Remove(filepath.Join(dir, countFileName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove reading count: %w", err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("remove reading count: %w", err)
	}
	return nil
}

// writeSynced creates (or truncates) path, writes b and syncs it.
func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// syncDir syncs the directory dir, making the creation, renaming and
// removal of its entries durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

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
	if err := writeCountFile(t.dir, n); err != nil {
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
	if err := removeCountFile(t.dir); err != nil {
		return err
	}
	t.countFile = false
	return nil
}
