package lazyfs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
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

// TornCut tears the next write to any of files (paths under Mnt):
// LazyFS persists the first of two halves of that write, then crashes,
// losing every write not fsynced. Once LazyFS is gone it calls stop,
// which must end the writer (the service, whose file system is gone
// under it; the cut is complete when it is dead), and mounts again. If
// none of files is written within 20 seconds it returns ErrNotTorn with
// LazyFS still running and the faults still armed (LazyFS cannot
// disarm one); the caller then cuts as usual, and Cut copes with a
// LazyFS that crashes at an armed fault meanwhile.
func (l *FS) TornCut(ctx context.Context, files []string, stop func() error) error {
	if len(files) == 0 {
		return errors.New("torn cut: no file to tear")
	}
	for _, file := range files {
		if l.crashed() {
			break // a file armed before was written and torn already
		}
		disk, err := l.diskPath(file)
		if err != nil {
			return err
		}
		cmd := fmt.Sprintf("lazyfs::torn-op::file=%s::parts=2::persist=1", disk)
		if err := l.command(cmd); err != nil {
			if l.crashed() {
				break
			}
			return err
		}
		if err := l.awaitConfigured(ctx, cmd); err != nil {
			if l.crashed() {
				break
			}
			return err
		}
	}
	select {
	case <-l.exited:
	case <-time.After(tornWait):
		return ErrNotTorn
	case <-ctx.Done():
		return ctx.Err()
	}
	l.torn = l.readTorn() // LazyFS empties its log when it starts
	l.log.Info("lazyfs crashed after a torn write", "armed", len(files), "torn", l.torn)
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
	f, err := l.openFaults()
	if err != nil {
		return err
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

// LastTorn is what LazyFS logged of the last torn write: the file, and
// the bytes of the write it persisted ("" when none is logged).
func (l *FS) LastTorn() string { return l.torn }

// readTorn is the last torn write in LazyFS's log.
func (l *FS) readTorn() string {
	b, err := os.ReadFile(filepath.Join(l.dir, "lazyfs.log"))
	if err != nil {
		return ""
	}
	last := ""
	for line := range strings.SplitSeq(string(b), "\n") {
		if i := strings.Index(line, "Write to path "); i >= 0 {
			last = line[i+len("Write to path "):]
		}
	}
	return last
}

// armWait bounds the wait for LazyFS to log a fault command it took.
const armWait = 5 * time.Second

// awaitConfigured waits until LazyFS's log says it took cmd whole. A
// LazyFS built without lazyfs-commands.patch reads its fault fifo 100
// bytes at a time and takes a longer command as two broken ones: the
// fault is then armed on a truncated path that is never written.
func (l *FS) awaitConfigured(ctx context.Context, cmd string) error {
	want := "configured successfully '" + cmd + "'"
	deadline := time.Now().Add(armWait)
	for {
		if b, err := os.ReadFile(filepath.Join(l.dir, "lazyfs.log")); err == nil && strings.Contains(string(b), want) {
			return nil
		}
		if l.crashed() {
			return errors.New("lazyfs exited while the faults were armed")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lazyfs did not take the fault command %q whole within %s (%d bytes; LazyFS reads its fifo 100 bytes at a time unless built with cmd/telemetry-crashloop/lazyfs-commands.patch); see %s",
				cmd, armWait, len(cmd)+1, filepath.Join(l.dir, "lazyfs.log"))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}
