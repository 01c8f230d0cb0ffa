// Package testhook holds the hooks that tests of the whole process set
// through environment variables, unset in production: a moved clock
// (TELEMETRY_CLOCK_OFFSET) and a fault point where the process kills
// itself between the stream and the store (TELEMETRY_TEST_CUT_AT).
package testhook

import (
	"fmt"
	"time"
)

// ClockOffsetEnv names a test hook, not a setting: a duration (Go
// syntax, "1m", "-1m30s") added to every reading of the wall clock by
// this process, so a test can run a node whose clock is off (Go
// programs read the clock without libc, so faketime cannot move it).
// In telemetryd it reaches everything that reads Main.now: leases, the partitions'
// freshness, rule groups' leases, the accepted window and retention.
// deploy/CLUSTER.md, "Under faults", says what it is for.
const ClockOffsetEnv = "TELEMETRY_CLOCK_OFFSET"

// maxClockOffset bounds the hook: a day either way.
const maxClockOffset = 24 * time.Hour

// Clock is time.Now moved by TELEMETRY_CLOCK_OFFSET, and the
// offset (0 when unset).
func Clock(getenv func(string) string) (func() time.Time, time.Duration, error) {
	s := getenv(ClockOffsetEnv)
	if s == "" {
		return time.Now, 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, 0, fmt.Errorf("%s=%q: want a duration such as 1m or -1m30s: %w", ClockOffsetEnv, s, err)
	}
	if d < -maxClockOffset || d > maxClockOffset {
		return nil, 0, fmt.Errorf("%s=%q: want at most %s either way", ClockOffsetEnv, s, maxClockOffset)
	}
	return func() time.Time { return time.Now().Add(d) }, d, nil
}
