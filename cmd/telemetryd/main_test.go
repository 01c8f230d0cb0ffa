package main

import (
	"context"
	"flag"
	"os"
	"sync"
	"testing"
	"time"
)

// lanes bound how many tests of each kind run at once. Every test that
// calls inLane runs in parallel with the others, in its lane:
//   - general: the service tests, most of which wait (for a restart, a
//     lease to lapse, a built binary) more than they compute;
//   - cluster: the tests of a three-server cluster, two at a time, each
//     starting six processes' worth of servers;
//   - chromium: the tests that drive a headless browser, one at a time.
//
// The lanes run beside each other, so the cluster tests overlap the
// rest. Once no test of the other lanes waits any more, a general test
// may also take a free place of theirs (the browser tests end early,
// the cluster tests often before the general ones): the package then
// runs as many tests at once as before, never more. In each lane the
// tests of startFirst go first, so that no long test starts last and
// ends the run alone.
//
// Tests that change process-wide state (the environment, the runtime's
// GC settings, the global telemetry providers) or measure the process's
// memory do not call inLane: Go runs them one after another before any
// parallel test starts.
var lanes = struct {
	general, cluster, chromium *lane
}{
	general:  &lane{name: "general", size: 2, borrows: true},
	cluster:  &lane{name: "cluster", size: 2},
	chromium: &lane{name: "chromium", size: 1},
}

// startFirst are the tests that take longest (tens of seconds on a
// loaded machine, seen with -v in the time each held its lane): in
// their lane they start before every other test.
var startFirst = map[string]bool{
	"TestAbuseRealBinary":                            true,
	"TestReadmeQuickStart":                           true,
	"TestBuildInfoNamesTheLinkedVersion":             true,
	"TestDeleteDeviceEndToEnd":                       true,
	"TestDamagedTableHoldsAckedReadingsUntilDropped": true,
	"TestLineProtocolConflicts":                      true,
	"TestDamagedTableRepaired":                       true,
	"TestStartAfterRestoreLogsCalmly":                true,
	"TestClusterAcceptance":                          true,
	"TestClusterFailover":                            true,
	"TestClusterNoStall":                             true,
	"TestClusterAccess":                              true,
	"TestClusterDeleteReachesANodeThatWasDown":       true,
	"TestUISparseDataInChromium":                     true,
	"TestUISignInInChromium":                         true,
}

// lane is a number of places for tests to run in at once.
type lane struct {
	name    string
	size    int  // places
	borrows bool // its tests may take another lane's free place
	held    int  // places taken, by its tests or borrowers
	waiting []*laneWaiter
}

// laneWaiter is a test waiting for a place.
type laneWaiter struct {
	first  bool // in startFirst
	ticket int  // order of arrival
}

// before reports whether w goes before o.
func (w *laneWaiter) before(o *laneWaiter) bool {
	if w.first != o.first {
		return w.first
	}
	return w.ticket < o.ticket
}

var (
	laneMu      sync.Mutex
	laneFreed   = sync.NewCond(&laneMu)
	laneTickets int
	lanesOpened time.Time // when the first test came to its lane
)

// settled is how long after the first test came to its lane every
// parallel test has come to its own: Go lets them all go at once, when
// the serial tests are done. Until then a lane nobody waits for may
// only not have seen its tests yet, and lends no place.
const settled = time.Second

// next reports whether w is the first of l's waiters.
func (l *lane) next(w *laneWaiter) bool {
	for _, o := range l.waiting {
		if o != w && o.before(w) {
			return false
		}
	}
	return true
}

// place is a lane with a free place for the next waiter of l: l itself,
// or, when l borrows and no test of another lane waits, another lane.
// laneMu is held.
func (l *lane) place() *lane {
	if l.held < l.size {
		return l
	}
	if !l.borrows || time.Since(lanesOpened) <= settled {
		return nil
	}
	others := []*lane{lanes.chromium, lanes.cluster}
	for _, o := range others {
		if len(o.waiting) > 0 {
			return nil // the longer chains run without more beside them
		}
	}
	for _, o := range others {
		if o.held < o.size {
			return o
		}
	}
	return nil
}

// inLane marks t parallel and waits for a place in lane, which it
// gives back after every other clean-up of t has run. The time t held
// its place, its own time without the wait for the lane, is logged
// then (seen with -v; the test's reported duration includes the wait):
// the longest chain of a lane bounds the package's time.
func inLane(t *testing.T, l *lane) {
	t.Helper()
	t.Parallel()
	laneMu.Lock()
	if laneTickets == 0 {
		lanesOpened = time.Now()
		time.AfterFunc(settled+10*time.Millisecond, laneFreed.Broadcast)
	}
	laneTickets++
	w := &laneWaiter{first: startFirst[t.Name()], ticket: laneTickets}
	l.waiting = append(l.waiting, w)
	var got *lane
	for {
		if got = l.place(); got != nil && l.next(w) {
			break
		}
		laneFreed.Wait()
	}
	for i, o := range l.waiting {
		if o == w {
			l.waiting = append(l.waiting[:i], l.waiting[i+1:]...)
			break
		}
	}
	got.held++
	laneMu.Unlock()
	// Another waiter of l may now be first, and a place still free.
	laneFreed.Broadcast()
	start := time.Now()
	t.Cleanup(func() {
		t.Logf("held a place of the %s lane %.1fs (a test of the %s lane)", got.name, time.Since(start).Seconds(), l.name)
		laneMu.Lock()
		got.held--
		laneMu.Unlock()
		laneFreed.Broadcast()
	})
}

// parallelTests is -parallel when the command line does not set it:
// more than the package has tests, so that the lanes, not -parallel,
// bound what runs at once (a test waiting for its lane holds a place
// of -parallel, and would keep a test of another lane from starting).
const parallelTests = "512"

// runsTelemetryd, set to 1 in a child's environment, makes this test
// binary run telemetryd's main with its arguments instead of the tests:
// telemetryd in a process of its own, without a build of the binary
// (a minute of a loaded machine). main is run with the process's
// arguments and environment, and so is this.
const runsTelemetryd = "GO_TEST_RUNS_TELEMETRYD"

// TestMain runs the package's tests, with -parallel at parallelTests
// unless the command line sets it, or telemetryd (runsTelemetryd).
func TestMain(m *testing.M) {
	if os.Getenv(runsTelemetryd) == "1" {
		os.Exit(run(context.Background(), os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
	}
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		if err := flag.Set("test.parallel", parallelTests); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
