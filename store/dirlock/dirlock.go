// Package dirlock holds a data directory exclusively: an flock on its
// LOCK file, which the kernel releases if the process dies, so two
// processes (or two stores in one) never open the same directory.
package dirlock

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// ErrLocked is returned by Lock when another process (or another
// holder in this process) already holds the data directory.
var ErrLocked = errors.New("data directory is locked by another process")

// lockFileName is the lock file inside the data directory.
const lockFileName = "LOCK"

// Lock is an exclusive flock on <dataDir>/LOCK, held while the store
// is open. The kernel releases it if the process dies.
type Lock struct {
	f *os.File
}

// Dir takes the lock of dataDir or fails at once with ErrLocked.
// A read-only holder leaves the file as it is.
func Dir(dataDir string, readOnly bool) (*Lock, error) {
	path := filepath.Join(dataDir, lockFileName)
	flags := os.O_RDWR | os.O_CREATE
	if readOnly {
		flags = os.O_RDONLY
	}
	f, err := os.OpenFile(path, flags, 0o644)
	if readOnly && errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%s: no data directory here", dataDir)
	}
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	// The pid is only a hint for operators; the flock is what counts.
	if readOnly {
		return &Lock{f: f}, nil
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &Lock{f: f}, nil
}

// Unlock releases the lock.
func (l *Lock) Unlock() error {
	if err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN); err != nil {
		_ = l.f.Close()
		return fmt.Errorf("unlock: %w", err)
	}
	return l.f.Close()
}
