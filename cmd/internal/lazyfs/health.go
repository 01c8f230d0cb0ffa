package lazyfs

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LazyFS can fail without exiting: a worker thread that finds an item
// lock of its cache already held by itself gets EDEADLK ("Resource
// deadlock avoided"); where LazyFS catches it, it takes the file for
// one it has not cached and works on the disk under it instead. So a
// loop that cuts the power also reads what LazyFS wrote and what the
// kernel logged about its processes, and reports it next to the loss.

// outputOK matches the lines LazyFS writes in a healthy run: its
// start-up, its commands, the trace of its truncate, and the abort of
// its fault thread at every unmount ("terminate called without an
// active exception": the thread is never joined).
var outputOK = regexp.MustCompile(`\[info\]|pre-allocating|Pre-allocation finished|\[lazyfs\.cmds\]|^>> FTRUNCATE$|BEHAVE AS|Ignoring invalid max threads|^terminate called without an active exception$|^\s*$`)

// outputBad matches lines that report a failure whatever their level
// (LazyFS logs a failed ftruncate of its fsync at info level).
var outputBad = regexp.MustCompile(`(?i)fail|error|what\(\)|deadlock|terminate called after`)

// OutputFaults returns the lines of LazyFS's output (all its processes
// of this FS) that a healthy run does not write, at most max of them,
// and how many there were.
func (l *FS) OutputFaults(max int) ([]string, int) {
	f, err := os.Open(filepath.Join(l.dir, "lazyfs.out"))
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	var out []string
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if outputOK.MatchString(line) && !outputBad.MatchString(line) {
			continue
		}
		n++
		if len(out) < max {
			out = append(out, line)
		}
	}
	return out, n
}

// Pids are the process IDs of every LazyFS this FS started, in order.
func (l *FS) Pids() []int { return l.pids }

// life is one LazyFS process: when it ran and how it ended.
type life struct {
	started, ended time.Time
	state          string // its exit status ("signal: segmentation fault")
}

// KernelFaults returns the kernel's log lines about a lazyfs process
// (segfaults, general protection faults) logged while one of this FS's
// processes ran, read with dmesg (needs root; nil when it cannot be
// read). The kernel names the faulting thread, not the process, so the
// lines are matched by time: another LazyFS running meanwhile on the
// machine can show up too.
func (l *FS) KernelFaults() []string {
	l.livesMu.Lock()
	lives := slices.Clone(l.lives)
	l.livesMu.Unlock()
	if len(lives) == 0 {
		return nil
	}
	b, err := exec.Command("dmesg").Output()
	if err != nil {
		return nil
	}
	boot := bootTime()
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		if !strings.Contains(line, "lazyfs[") {
			continue
		}
		at, ok := dmesgTime(line, boot)
		if !ok {
			continue
		}
		for _, lf := range lives {
			end := lf.ended
			if end.IsZero() {
				end = time.Now()
			}
			if !at.Before(lf.started.Add(-time.Second)) && !at.After(end.Add(time.Second)) {
				out = append(out, at.UTC().Format("15:04:05 ")+strings.TrimSpace(line[strings.Index(line, "]")+1:]))
				break
			}
		}
	}
	return out
}

// Exits returns how each LazyFS process of this FS ended, in order
// ("" while it runs). Every unmount ends one with SIGABRT (its fault
// thread is never joined); a segfault is LazyFS failing.
func (l *FS) Exits() []string {
	l.livesMu.Lock()
	defer l.livesMu.Unlock()
	out := make([]string, len(l.lives))
	for i, lf := range l.lives {
		out[i] = lf.state
	}
	return out
}

// bootTime is when the machine booted (btime in /proc/stat).
func bootTime() time.Time {
	b, _ := os.ReadFile("/proc/stat")
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			if s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
				return time.Unix(s, 0)
			}
		}
	}
	return time.Time{}
}

// dmesgTime is the time of a dmesg line ("[seconds since boot] ...").
func dmesgTime(line string, boot time.Time) (time.Time, bool) {
	open, end := strings.IndexByte(line, '['), strings.IndexByte(line, ']')
	if boot.IsZero() || open != 0 || end < 0 {
		return time.Time{}, false
	}
	s, err := strconv.ParseFloat(strings.TrimSpace(line[1:end]), 64)
	if err != nil {
		return time.Time{}, false
	}
	return boot.Add(time.Duration(s * float64(time.Second))), true
}

// usageLine is LazyFS's answer to lazyfs::display-cache-usage.
var usageLine = regexp.MustCompile(`cache usage \(.?%pages\) is ([0-9.]+)%`)

// CacheUsage asks LazyFS how full its cache is (the share of its
// pages in use, 0-100) and waits up to 5 s for the answer in its
// output. The cache never evicts and is emptied only by a cut; at 100
// LazyFS writes what it cannot cache straight to the disk under it.
func (l *FS) CacheUsage(ctx context.Context) (float64, error) {
	if l.crashed() {
		return 0, errors.New("lazyfs is not running")
	}
	out := filepath.Join(l.dir, "lazyfs.out")
	before := countMatches(out)
	f, err := l.openFaults()
	if err != nil {
		return 0, err
	}
	_, err = f.WriteString("lazyfs::display-cache-usage\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", l.faults, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if ms := usageLine.FindAllStringSubmatch(readFile(out), -1); len(ms) > before {
			return strconv.ParseFloat(ms[len(ms)-1][1], 64)
		}
		if time.Now().After(deadline) {
			return 0, errors.New("lazyfs did not report its cache usage within 5s")
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-l.exited:
			return 0, errors.New("lazyfs exited")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func countMatches(path string) int { return len(usageLine.FindAllStringIndex(readFile(path), -1)) }

func readFile(path string) string {
	b, _ := os.ReadFile(path)
	return string(b)
}
