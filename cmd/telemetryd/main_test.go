package main

import (
	"flag"
	"os"
	"testing"
)

// parallelTests is how many tests marked t.Parallel run at once when
// the command line does not say. The parallel ones are the tests that
// spend most of their time waiting: for a lease to lapse, an election,
// a restarted node or a built binary. At the default (GOMAXPROCS, two
// on a small box) they would wait one after another.
const parallelTests = "4"

// TestMain runs the package's tests, with -parallel at parallelTests
// unless the command line sets it. Tests that change process-wide
// state (environment variables, the runtime's GC settings) or measure
// a share of the machine stay serial: Go runs every serial test before
// the first parallel one starts.
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
