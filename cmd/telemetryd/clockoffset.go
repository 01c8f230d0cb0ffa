package main

import (
	"fmt"
	"time"
)

// clockOffsetEnv names a test hook, not a setting: a duration (Go
// syntax, "1m", "-1m30s") added to every reading of the wall clock by
// this process, so a test can run a node whose clock is off (Go
// programs read the clock without libc, so faketime cannot move it).
// It reaches everything that reads m.now: leases, the partitions'
// freshness, rule groups' leases, the accepted window and retention.
// deploy/CLUSTER.md, "Under faults", says what it is for.
const clockOffsetEnv = "TELEMETRY_CLOCK_OFFSET"

// maxClockOffset bounds the hook: a day either way.
const maxClockOffset = 24 * time.Hour

// clockFromEnv is time.Now moved by TELEMETRY_CLOCK_OFFSET, and the
// offset (0 when unset).
func clockFromEnv(getenv func(string) string) (func() time.Time, time.Duration, error) {
	s := getenv(clockOffsetEnv)
	if s == "" {
		return time.Now, 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return nil, 0, fmt.Errorf("%s=%q: want a duration such as 1m or -1m30s: %w", clockOffsetEnv, s, err)
	}
	if d < -maxClockOffset || d > maxClockOffset {
		return nil, 0, fmt.Errorf("%s=%q: want at most %s either way", clockOffsetEnv, s, maxClockOffset)
	}
	return func() time.Time { return time.Now().Add(d) }, d, nil
}

// useClockOffset moves m.now by TELEMETRY_CLOCK_OFFSET, when set, and
// says so in the log.
func (m *Main) useClockOffset() error {
	now, d, err := clockFromEnv(m.getenv)
	if err != nil || d == 0 {
		return err
	}
	m.now = now
	m.log.Warn("test hook: this process's clock is moved", "env", clockOffsetEnv, "offset", d.String())
	return nil
}
