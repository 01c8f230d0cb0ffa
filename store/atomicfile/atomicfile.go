// Package atomicfile replaces small files whole: a reader finds either
// the old content or the new, never part of it, also after a crash.
package atomicfile

import (
	"errors"
	"os"
	"path/filepath"
)

// Replace atomically replaces dir/name with b: it writes and syncs a
// temporary file, renames it over name and syncs dir.
func Replace(dir, name string, b []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if err := errors.Join(err, f.Close()); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return SyncDir(dir)
}

// SyncDir syncs the directory dir, making the creation, renaming and
// removal of its entries durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}
