package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// diskHangAfter is how long a LazyFS may leave its process waiting for
// an answer while it uses no CPU at all before the harness takes it
// for hung.
const diskHangAfter = 30 * time.Second

// diskSample is what watchDisks last saw of one LazyFS: its CPU time,
// and since when it has not changed while its process waited on it.
type diskSample struct {
	ticks uint64
	since time.Time
}

// watchDisks looks every few seconds, until ctx ends, for a LazyFS that
// stopped answering: the process on it (a NATS server or a node) has a
// thread waiting for a FUSE answer and LazyFS has used no CPU for
// diskHangAfter. It kills such a LazyFS, which fails the waiting file
// operations; the machine's power is then cut as after any LazyFS exit
// (diskCrashes, startSupervised). A LazyFS in that state was seen on a
// 30-minute run: the NATS servers' writes (pwrite) waited on their
// disks for minutes, their raft groups stalled ("has NO quorum,
// stalled") and no node could start; a SIGKILLed server stayed a
// zombie, its threads in request_wait_answer, until its LazyFS died.
func (c *cluster) watchDisks(ctx context.Context) {
	seen := map[int]diskSample{}
	tick(ctx, 5*time.Second, func() {
		c.diskMu.Lock()
		defer c.diskMu.Unlock()
		for m, l := range c.lfs {
			pids := l.Pids()
			if l.crashed() || len(pids) == 0 {
				delete(seen, m)
				continue
			}
			lpid := pids[len(pids)-1]
			ticks, err := cpuTicks(lpid)
			if err != nil {
				continue
			}
			s, ok := seen[m]
			now := time.Now()
			if !ok || s.ticks != ticks || !waitsOnFUSE(c.member(m).pid()) {
				seen[m] = diskSample{ticks: ticks, since: now}
				continue
			}
			if now.Sub(s.since) < diskHangAfter {
				continue
			}
			c.log.Warn("LazyFS stopped answering: killed; the machine's power is cut next", "member", c.net.members[m],
				"waited", now.Sub(s.since).Round(time.Second), "lazyfs_pid", lpid)
			c.diskHung[m] = true
			_ = syscall.Kill(lpid, syscall.SIGKILL)
			delete(seen, m)
		}
	})
}

// member is the process of member m: NATS server m, or node m-servers.
func (c *cluster) member(m int) *proc {
	if m < servers {
		return c.nats[m]
	}
	return c.nodes[m-servers]
}

// cpuTicks is the CPU time (user and system, in clock ticks) process
// pid has used.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// pid (comm) state ppid ...: comm may hold anything, so count the
	// fields after its closing parenthesis; utime and stime are the
	// 14th and 15th of the line.
	i := bytes.LastIndexByte(b, ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	u, err1 := strconv.ParseUint(f[11], 10, 64)
	s, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	return u + s, nil
}

// waitsOnFUSE reports whether a thread of process pid waits for the
// answer of a FUSE file system.
func waitsOnFUSE(pid int) bool {
	if pid <= 0 {
		return false
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/wchan", pid))
	for _, t := range tasks {
		if b, err := os.ReadFile(t); err == nil && string(b) == "request_wait_answer" {
			return true
		}
	}
	return false
}
