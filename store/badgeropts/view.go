package badgeropts

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/dgraph-io/badger/v4"
)

// A read-only store (Options.ReadOnly: a retention dry run, an
// inspection beside a stopped service) must change nothing on disk,
// but Badger cannot open a database read-only when it was not closed
// cleanly: its write-ahead log must be replayed and truncated first.
// Such a database (the device index or a day table) is opened from a
// temporary copy under the system's temporary directory: its SSTables
// are hard-linked when the file system allows it (Badger never changes
// an SSTable; it only deletes it, which leaves the original) and copied
// otherwise, the other files are copied, and the copy is opened
// writable, replayed there, and removed when the database closes. The
// original stays byte for byte as it was.

// views maps a database opened on a temporary copy to the copy's
// directory.
var views sync.Map // *badger.DB -> string

// OpenView opens opts with open; for a read-only open of a database
// that was not closed cleanly it opens a temporary copy instead.
func OpenView(opts badger.Options, open func(badger.Options) (*badger.DB, error)) (*badger.DB, error) {
	if !opts.ReadOnly || ClosedCleanly(opts.Dir) {
		return open(opts)
	}
	tmp, err := os.MkdirTemp("", "telemetryd-view-")
	if err != nil {
		return nil, fmt.Errorf("read-only view of %s: %w", opts.Dir, err)
	}
	if err := copyForView(opts.Dir, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return nil, fmt.Errorf("read-only view of %s (not closed cleanly): %w", opts.Dir, err)
	}
	db, err := open(opts.WithDir(tmp).WithValueDir(tmp).WithReadOnly(false))
	if err != nil {
		_ = os.RemoveAll(tmp)
		return nil, err
	}
	views.Store(db, tmp)
	return db, nil
}

// ReleaseView removes the temporary copy db was opened on, if any;
// db must be closed.
func ReleaseView(db *badger.DB) {
	if dir, ok := views.LoadAndDelete(db); ok {
		_ = os.RemoveAll(dir.(string))
	}
}

// copyForView copies the files of the database in src to dst.
func copyForView(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() || e.Name() == "LOCK" {
			continue
		}
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if strings.HasSuffix(e.Name(), ".sst") && os.Link(from, to) == nil {
			continue
		}
		if err := copyFile(from, to); err != nil {
			return err
		}
	}
	return nil
}

// copyFile copies the file from to the new file to.
func copyFile(from, to string) (err error) {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}
