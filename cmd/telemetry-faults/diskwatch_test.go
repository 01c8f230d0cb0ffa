package main

import (
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/lazyfs"
)

// TestWatchDisksKillsAHungLazyFS: a LazyFS that stops answering (here
// stopped with SIGSTOP) while a process writes to it is killed by the
// watcher and marked hung, so that the machine's power is cut next.
// It needs LazyFS (TELEMETRY_LAZYFS) and root, and takes about 40 s.
func TestWatchDisksKillsAHungLazyFS(t *testing.T) {
	bin, log := lazyFSForTest(t)
	dir := t.TempDir()
	fs, err := lazyfs.NewSized(bin, filepath.Join(dir, "lazyfs"), filepath.Join(dir, "disk"), "64mb", log)
	require.NoError(t, err)
	require.NoError(t, fs.Mount(t.Context()))
	t.Cleanup(func() { _ = fs.Close() })
	writer := exec.Command("dd", "if=/dev/zero", "of="+filepath.Join(fs.Mnt, "f"), "bs=4k", "count=10000000", "oflag=sync")
	require.NoError(t, writer.Start())
	t.Cleanup(func() { _ = writer.Process.Kill(); _ = writer.Wait() })

	c := &cluster{lfs: []*lazyMount{{FS: fs, mnt: fs.Mnt}}, nats: []*proc{{name: "nats-0", cmd: writer}},
		net: &network{members: []string{"nats-0"}}, log: log, diskHung: map[int]bool{}}
	time.Sleep(time.Second) // dd writes
	pids := fs.Pids()
	require.NoError(t, syscall.Kill(pids[len(pids)-1], syscall.SIGSTOP))
	go c.watchDisks(t.Context())
	select {
	case <-fs.Exited():
	case <-time.After(3 * diskHangAfter):
		t.Fatalf("the stopped LazyFS was not killed within %s", 3*diskHangAfter)
	}
	c.diskMu.Lock()
	defer c.diskMu.Unlock()
	assert.True(t, c.diskHung[0], "marked hung")
	assert.Equal(t, []int{0}, c.crashedDisks())
}
