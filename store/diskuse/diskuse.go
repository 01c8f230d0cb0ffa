// Package diskuse measures the disk space of files as du counts it.
// Badger preallocates its value log and memtable files sparsely, so a
// file counts with the smaller of its length and its allocated blocks.
package diskuse

import (
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// File is the disk space of the file info describes: the smaller of
// its length and its allocated blocks.
func File(info fs.FileInfo) int64 {
	n := info.Size()
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		n = min(n, st.Blocks*512)
	}
	return n
}

// Dir is the disk space of the regular files directly in dir (0 when
// it cannot be read).
func Dir(dir string) int64 {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			n += File(info)
		}
	}
	return n
}

// Tree is the disk space of every regular file under dir. Files that
// vanish during the walk (a compaction removing a table) are skipped.
func Tree(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			n += File(info)
		}
		return nil
	})
	return n
}

// Unallocated is the space Badger's memtable logs (*.mem) under dir
// may still claim: their length minus their allocated blocks. Badger
// creates them sparse, at their full size, and writes them through a
// memory map, so a write into a hole when the file system is full is
// not an error but a SIGBUS that ends the process: the free space must
// stay above this. (Value logs, *.vlog, are sparse too, but the store
// writes to them only values of 1 MiB or more.) Directories named in
// skip are not entered.
func Unallocated(dir string, skip ...string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return nil
		case d.IsDir():
			for _, s := range skip {
				if d.Name() == s && path != dir {
					return filepath.SkipDir
				}
			}
			return nil
		case filepath.Ext(d.Name()) != ".mem":
			return nil
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			n += info.Size() - File(info)
		}
		return nil
	})
	return n
}
