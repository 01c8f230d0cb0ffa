package backup

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// dirLock is an exclusive flock on a backup directory's LOCK file; the
// kernel releases it if the process dies.
type dirLock struct {
	f *os.File
}

// unlock releases the lock.
func (l *dirLock) unlock() error {
	if err := syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN); err != nil {
		_ = l.f.Close()
		return fmt.Errorf("unlock: %w", err)
	}
	return l.f.Close()
}

// lockBackupDir takes an exclusive lock on the backup directory.
func lockBackupDir(dir string) (*dirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("backup: %s: another backup is writing there: %w", dir, err)
	}
	return &dirLock{f: f}, nil
}
