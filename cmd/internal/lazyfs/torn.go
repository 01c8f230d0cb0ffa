package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// A torn write is a power cut in the middle of a write: the disk got
// part of it. LazyFS's torn-op fault splits the next write to one file
// into parts, persists those asked for (past its cache, as if the disk
// had written them) and then crashes, which drops every unsynced write
// still in its cache. TornCut arms it on a file while the service
// writes, waits for the crash, and leaves the file system mounted again
// for the next start; the caller kills the service in between (see
// TornCut).

// tornWait bounds the wait for the armed file's next write.
const tornWait = 20 * time.Second

// ErrNotTorn is TornCut's error when the file was not written within
// the wait: nothing was torn and LazyFS still runs.
var ErrNotTorn = errors.New("the file was not written while the fault was armed")

// diskPath is the name LazyFS gives a file under the mount in its
// faults: its path on the disk under the mount.
func (l *FS) diskPath(mounted string) (string, error) {
	rel, err := filepath.Rel(l.Mnt, mounted)
	if err != nil || rel == ".." || filepath.IsAbs(rel) || len(rel) >= 2 && rel[:2] == ".." {
		return "", fmt.Errorf("%s is not under the mount %s", mounted, l.Mnt)
	}
	return filepath.Join(l.root, rel), nil
}

// TornCut tears the next write to file (a path under Mnt): LazyFS
// persists the first of two halves of that write, then crashes, losing
// every write not fsynced. Once LazyFS is gone it calls stop, which
// must end the writer (the service, whose file system is gone under
// it; the cut is complete when it is dead), and mounts again. If file
// is not written within 20 seconds it returns ErrNotTorn with LazyFS
// still running and the fault possibly still armed; the caller then
// cuts as usual.
func (l *FS) TornCut(ctx context.Context, file string, stop func() error) error {
	disk, err := l.diskPath(file)
	if err != nil {
		return err
	}
	if err := l.command(fmt.Sprintf("lazyfs::torn-op::file=%s::parts=2::persist=1", disk)); err != nil {
		return err
	}
	select {
	case <-l.exited:
	case <-time.After(tornWait):
		return ErrNotTorn
	case <-ctx.Done():
		return ctx.Err()
	}
	l.log.Info("lazyfs crashed after a torn write", "file", file)
	if err := stop(); err != nil {
		return err
	}
	if err := l.unmount(); err != nil {
		return err
	}
	return l.Mount(ctx)
}

// command writes one fault command to LazyFS's fifo.
func (l *FS) command(cmd string) error {
	select {
	case <-l.exited:
		return errors.New("lazyfs is not running")
	default:
	}
	f, err := os.OpenFile(l.faults, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", l.faults, err)
	}
	_, err = f.WriteString(cmd + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", l.faults, err)
	}
	return nil
}
