// Package lazyfs runs LazyFS (github.com/dsrhaslab/lazyfs), a FUSE file
// system that keeps every write in its own cache until the writer
// fsyncs it, and cuts the power: drops every write that was not
// fsynced. The crash loop and the fault harness put data dirs on it.
package lazyfs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// FS runs LazyFS (github.com/dsrhaslab/lazyfs), a FUSE file system
// that keeps every write in its own cache until the writer fsyncs it,
// and drops what was not synced on command. It mounts root at mnt; a
// power cut is: the service is dead, the writes the kernel still holds
// for the mount are handed to LazyFS (syncfs, which LazyFS does not
// turn into fsyncs), LazyFS drops every unsynced write
// (lazyfs::clear-cache), and the file system is unmounted and mounted
// again, as after a reboot (LazyFS's cache lives in its memory, so the
// unmount alone would drop it too; the command makes the drop
// explicit and logged). What survives is what was fsynced.
//
// LazyFS persists namespace operations (create, rename, unlink,
// truncate) at once; only file data waits for fsync.
type FS struct {
	bin    string // the lazyfs binary
	dir    string // config, fifos and log
	root   string // the backing directory, what a disk would hold
	Mnt    string // the mount point
	log    *slog.Logger
	config string
	faults string // fifo LazyFS reads commands from
	acks   string // fifo LazyFS reports finished commands on

	cmd     *exec.Cmd
	exited  chan struct{}
	ackf    *os.File
	lines   chan string // lines read from acks
	torn    string      // the last torn write (LastTorn)
	pids    []int       // every LazyFS process started (Pids)
	lives   []life      // when each ran and how it ended (KernelFaults)
	livesMu sync.Mutex
}

// lazyFSCacheSize is LazyFS's cache: the unsynced writes it can hold
// between two power cuts. Past it LazyFS writes through to root, which
// only makes a cut lose less.
const lazyFSCacheSize = "512mb"

// New prepares a LazyFS mount of root at dir/mnt with the default cache
// (512 MB); Mount starts it.
func New(bin, dir, root string, log *slog.Logger) (*FS, error) {
	return NewSized(bin, dir, root, lazyFSCacheSize, log)
}

// NewSized is New with a cache of size (LazyFS's notation, e.g.
// "2gb"). The cache keeps synced writes too and never evicts
// (apply_eviction=false), so give it room for everything written to the
// mount between two cuts: a 512 MB cache under a cluster node and its
// NATS server (about 430 MB on disk after 7 minutes) stopped answering,
// its writers hung in fsync and lookups until LazyFS was killed.
func NewSized(bin, dir, root, size string, log *slog.Logger) (*FS, error) {
	if bin == "" {
		return nil, errors.New("no lazyfs binary given (see cmd/telemetry-crashloop/README.md)")
	}
	if _, err := exec.LookPath(bin); err != nil {
		return nil, fmt.Errorf("-lazyfs %s: %w", bin, err)
	}
	l := &FS{bin: bin, dir: dir, root: root, Mnt: filepath.Join(dir, "mnt"), log: log,
		config: filepath.Join(dir, "lazyfs.toml"), faults: filepath.Join(dir, "faults.fifo"),
		acks: filepath.Join(dir, "faults-done.fifo"), lines: make(chan string, 16)}
	for _, d := range []string{root, l.Mnt} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	for _, f := range []string{l.faults, l.acks} {
		if err := unix.Mkfifo(f, 0o600); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, fmt.Errorf("mkfifo %s: %w", f, err)
		}
	}
	cfg := fmt.Sprintf(`[faults]
fifo_path=%q
fifo_path_completed=%q

[cache]
apply_eviction=false

[cache.simple]
custom_size=%q
blocks_per_page=1

[filesystem]
log_all_operations=false
logfile=%q
`, l.faults, l.acks, size, filepath.Join(dir, "lazyfs.log"))
	if err := os.WriteFile(l.config, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	// Read and write: LazyFS's open for writing never blocks, and the
	// reader outlives every LazyFS instance of the run.
	ackf, err := os.OpenFile(l.acks, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", l.acks, err)
	}
	l.ackf = ackf
	go func() {
		sc := bufio.NewScanner(ackf)
		for sc.Scan() {
			l.lines <- sc.Text()
		}
		close(l.lines)
	}()
	return l, nil
}

// Mount starts LazyFS and waits until the mount is there.
func (l *FS) Mount(ctx context.Context) error {
	out, err := os.OpenFile(filepath.Join(l.dir, "lazyfs.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	l.cmd = exec.Command(l.bin, l.Mnt, "--config-path", l.config,
		"-o", "allow_other", "-o", "modules=subdir", "-o", "subdir="+l.root, "-f")
	l.cmd.Stdout, l.cmd.Stderr = out, out
	// LazyFS unmounts on SIGTERM: a crash loop that dies takes its mount
	// with it.
	l.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := l.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", l.bin, err)
	}
	l.pids = append(l.pids, l.cmd.Process.Pid)
	l.livesMu.Lock()
	l.lives = append(l.lives, life{started: time.Now()})
	n := len(l.lives) - 1
	l.livesMu.Unlock()
	l.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		l.livesMu.Lock()
		l.lives[n].ended, l.lives[n].state = time.Now(), cmd.ProcessState.String()
		l.livesMu.Unlock()
		close(done)
	}(l.cmd, l.exited)
	deadline := time.Now().Add(mountWait)
	for {
		if ok, err := l.mounted(); err != nil {
			return err
		} else if ok {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("lazyfs not mounted at %s after %s; see %s", l.Mnt, mountWait, out.Name())
		}
		select {
		case <-l.exited:
			return fmt.Errorf("lazyfs exited before mounting %s; see %s", l.Mnt, out.Name())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// mountWait bounds a mount: LazyFS allocates its whole cache first,
// which takes a while for a large one on a busy machine.
const mountWait = 2 * time.Minute

// mounted reports whether a LazyFS file system is mounted at l.Mnt.
// FUSE names its type after the binary: fuse.lazyfs, or
// fuse.lazyfs-patched for a binary of that name.
func (l *FS) mounted() (bool, error) {
	fstype := "fuse." + filepath.Base(l.bin)
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		// ID parent major:minor root mountpoint options ... - fstype source super
		if len(f) < 5 || f[4] != l.Mnt {
			continue
		}
		for i, v := range f {
			if v == "-" && i+1 < len(f) && f[i+1] == fstype {
				return true, nil
			}
		}
	}
	return false, nil
}

// Cut loses every write not fsynced since the last cut, then mounts
// the file system again. The service must not be running.
//
// A LazyFS that crashed meanwhile (a torn-write fault still armed when
// the service wrote the file, see TornCut) has dropped every unsynced
// write itself: the cut then only mounts again.
func (l *FS) Cut(ctx context.Context) error {
	if err := l.handOver(); err != nil {
		// A LazyFS that died leaves its mount answering ENOTCONN
		// until its process is reaped.
		if !errors.Is(err, unix.ENOTCONN) || !l.exitedWithin(5*time.Second) {
			return err
		}
	}
	if !l.crashed() {
		if err := l.clearCache(ctx); err != nil && !l.crashed() {
			return err
		}
	}
	if l.crashed() {
		l.log.Warn("lazyfs had exited before the cut (an armed fault, or see its output); its unsynced writes are gone", "mount", l.Mnt,
			"output", filepath.Join(l.dir, "lazyfs.out"), "log", filepath.Join(l.dir, "lazyfs.log"))
	}
	if err := l.unmount(); err != nil {
		return err
	}
	return l.Mount(ctx)
}

// Exited is closed when the LazyFS process exits (nil before Mount).
func (l *FS) Exited() <-chan struct{} { return l.exited }

// Crashed reports whether the LazyFS process has exited (false before
// Mount).
func (l *FS) Crashed() bool { return l.crashed() }

// crashed reports whether the LazyFS process has exited.
func (l *FS) crashed() bool {
	if l.exited == nil {
		return false
	}
	select {
	case <-l.exited:
		return true
	default:
		return false
	}
}

// exitedWithin reports whether the LazyFS process exits within d.
func (l *FS) exitedWithin(d time.Duration) bool {
	if l.exited == nil {
		return false
	}
	select {
	case <-l.exited:
		return true
	case <-time.After(d):
		return false
	}
}

// openFaults opens LazyFS's fault fifo for writing without waiting for
// a reader: a LazyFS that exited leaves none, and a blocking open
// would wait for ever.
func (l *FS) openFaults() (*os.File, error) {
	fd, err := unix.Open(l.faults, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s (is lazyfs running?): %w", l.faults, err)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), l.faults), nil
}

// handOver moves the writes the kernel still holds for the mount
// (dirty pages of written or memory-mapped files) to LazyFS, as
// unsynced writes, so that the cut drops them too. syncfs on a FUSE
// mount writes dirty pages back but sends no fsync: LazyFS keeps them
// in its cache.
func (l *FS) handOver() error {
	fd, err := unix.Open(l.Mnt, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", l.Mnt, err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncfs %s: %w", l.Mnt, err)
	}
	return nil
}

// clearCache tells LazyFS to drop every unsynced write and waits until
// it did.
func (l *FS) clearCache(ctx context.Context) error {
	select {
	case <-l.exited: // no reader: opening the fifo would wait for ever
		return errors.New("lazyfs is not running")
	default:
	}
	f, err := l.openFaults()
	if err != nil {
		return err
	}
	_, err = f.WriteString("lazyfs::clear-cache\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", l.faults, err)
	}
	timeout := time.After(time.Minute)
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				return errors.New("lazyfs completion fifo closed")
			}
			if line == "finished::clear-cache" {
				return nil
			}
		case <-l.exited:
			return errors.New("lazyfs exited while clearing its cache")
		case <-timeout:
			return errors.New("lazyfs did not clear its cache within a minute")
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// unmount unmounts the file system and waits for LazyFS to exit,
// killing it after 10 seconds.
func (l *FS) unmount() error {
	if l.cmd == nil {
		return nil
	}
	out, err := exec.Command("fusermount3", "-u", l.Mnt).CombinedOutput()
	if err != nil {
		l.log.Warn("fusermount3 -u failed; killing lazyfs", "mount", l.Mnt, "err", err, "output", strings.TrimSpace(string(out)))
		_ = l.cmd.Process.Signal(syscall.SIGKILL)
	}
	select {
	case <-l.exited:
	case <-time.After(10 * time.Second):
		_ = l.cmd.Process.Signal(syscall.SIGKILL)
		<-l.exited
	}
	l.cmd = nil
	if ok, _ := l.mounted(); ok {
		// A killed LazyFS leaves its mount behind: detach it.
		if out, err := exec.Command("fusermount3", "-uz", l.Mnt).CombinedOutput(); err != nil {
			return fmt.Errorf("fusermount3 -uz %s: %w: %s", l.Mnt, err, out)
		}
	}
	return nil
}

// Close unmounts and stops reading the completion fifo.
func (l *FS) Close() error {
	err := l.unmount()
	l.ackf.Close()
	return err
}
