// Package countfile keeps the count file of a day table: the number of
// readings the table holds, in a file beside its Badger files, so that
// the tables can be listed with their counts without opening them.
//
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
// unnoticed: by the store's compactor when it settles a table before an
// idle close and for an open table that nobody wrote to for a while,
// and by the store's Close after the table is closed cleanly. Before the next
// commit to the table it is removed, and the removal is synced, so a
// crash after a commit never leaves a stale count behind: such a table
// has no count file and its count is unknown (-1) until it is opened
// again.
//
// Badger ignores files it does not know (it reads MANIFEST and lists
// *.sst, *.vlog and *.mem files only), repair.CheckFiles reads *.sst
// files only, and discovery looks only at the names of table
// directories, so the file needs no special handling anywhere else.
package countfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"github.com/telemetryd/telemetryd/store/atomicfile"
)

// FileName is the name of the count file in a table directory. It
// holds the number of readings in decimal followed by a newline.
const FileName = "READINGS"

// maxCountFileSize bounds what Read reads: a count is at most
// 19 digits and a newline.
const maxCountFileSize = 20

// Read returns the count in the count file of the table in
// dir; ok is false when there is none. A file that does not hold a
// count is an error.
func Read(dir string) (n int64, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(dir, FileName))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("read reading count: %w", err)
	}
	n, err = Parse(b)
	if err != nil {
		return 0, false, fmt.Errorf("read reading count: %w", err)
	}
	return n, true, nil
}

// Parse parses the contents of a count file: decimal digits and a
// newline, nothing else.
func Parse(b []byte) (int64, error) {
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

// Write atomically replaces the count file of the table in dir
// with n, durably: the new file is synced before it is renamed into
// place and the directory is synced after.
func Write(dir string, n int64) error {
	tmp := filepath.Join(dir, FileName+".tmp")
	err := writeSynced(tmp, []byte(strconv.FormatInt(n, 10)+"\n"))
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, FileName))
	}
	if err == nil {
		err = atomicfile.SyncDir(dir)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write reading count: %w", err)
	}
	return nil
}

// Remove removes the count file of the table in dir, if any,
// and syncs the directory so that the removal is on disk before any
// commit that follows.
func Remove(dir string) error {
	err := os.Remove(filepath.Join(dir, FileName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove reading count: %w", err)
	}
	if err := atomicfile.SyncDir(dir); err != nil {
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
