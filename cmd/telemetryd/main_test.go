package main

import (
	"flag"
	"os"
	"testing"
)

// lanes bound how many tests of each kind run at once. Every test that
// calls inLane runs in parallel with the others, in its lane:
//   - general: the service tests, most of which wait (for a restart, a
//     lease to lapse, a built binary) more than they compute;
//   - cluster: the tests of a three-server cluster, two at a time, each
//     starting six processes' worth of servers;
//   - chromium: the tests that drive a headless browser, one at a time.
//
// The lanes run beside each other, so the cluster tests, the longest
// chain, overlap the rest. Tests that change process-wide state (the
// environment, the runtime's GC settings, the global telemetry
// providers) or measure the process's memory do not call inLane: Go
// runs them one after another before any parallel test starts.
var lanes = struct {
	general, cluster, chromium chan struct{}
}{
	general:  make(chan struct{}, 2),
	cluster:  make(chan struct{}, 2),
	chromium: make(chan struct{}, 1),
}

// inLane marks t parallel and waits for a place in lane, which it
// gives back after every other clean-up of t has run.
func inLane(t *testing.T, lane chan struct{}) {
	t.Helper()
	t.Parallel()
	lane <- struct{}{}
	t.Cleanup(func() { <-lane })
}

// parallelTests is -parallel when the command line does not set it:
// more than the package has tests, so that the lanes, not -parallel,
// bound what runs at once (a test waiting for its lane holds a place
// of -parallel, and would keep a test of another lane from starting).
const parallelTests = "512"

// TestMain runs the package's tests, with -parallel at parallelTests
// unless the command line sets it.
func TestMain(m *testing.M) {
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
