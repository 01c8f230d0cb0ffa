package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// ErrLocked is returned by Open when another process (or another Store
// in this process) already holds the data directory.
var ErrLocked = errors.New("data directory is locked by another process")

// lockFileName is the lock file inside the data directory.
const lockFileName = "LOCK"

// dirLock is an exclusive flock on <dataDir>/LOCK, held while the Store
// is open. The kernel releases it if the process dies.
type dirLock struct {
	f *os.File
}

// lockDir takes the lock or fails at once with ErrLocked.
// A read-only holder leaves the file as it is.
func lockDir(dataDir string, readOnly bool) (*dirLock, error) {
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
		return &dirLock{f: f}, nil
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &dirLock{f: f}, nil
}

// unlock releases the lock.
func (l *dirLock) unlock() error {
	if err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN); err != nil {
		_ = l.f.Close()
		return fmt.Errorf("unlock: %w", err)
	}
	return l.f.Close()
}
