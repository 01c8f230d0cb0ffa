package testhook

import (
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/telemetryd/telemetryd/store"
)

// Power-cut tests (cmd/telemetry-crashloop -cut-at) stop the service at
// a boundary between the stream and the store rather than at a random
// moment. Two environment variables, read only here and unset in
// production, arm it:
//
//	TELEMETRY_TEST_CUT_AT   before-commit, after-commit or either (store.FaultPoint)
//	TELEMETRY_TEST_CUT_ARM  a file: once it exists, the first write reaching that point kills the process
//
// The process SIGKILLs itself there, so nothing after the point runs;
// the crash loop then drops what was not fsynced.
const (
	envCutAt  = "TELEMETRY_TEST_CUT_AT"
	envCutArm = "TELEMETRY_TEST_CUT_ARM"
	// cutArmCheck is how often a write looks for the arm file.
	cutArmCheck = 10 * time.Millisecond
)

// FaultPoint returns the store's fault hook the environment asks for,
// or nil.
func FaultPoint(getenv func(string) string, log *slog.Logger) (func(store.FaultPoint), error) {
	return faultHook(getenv, log, func() {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal ends the process before anything else runs here
	})
}

// faultHook is FaultPoint with kill as the way to stop.
func faultHook(getenv func(string) string, log *slog.Logger, kill func()) (func(store.FaultPoint), error) {
	at := getenv(envCutAt)
	if at == "" {
		return nil, nil
	}
	switch store.FaultPoint(at) {
	case store.BeforeCommit, store.AfterCommit, "either":
	default:
		return nil, fmt.Errorf("%s=%q: want %s, %s or either", envCutAt, at, store.BeforeCommit, store.AfterCommit)
	}
	arm := getenv(envCutArm)
	if arm == "" {
		return nil, fmt.Errorf("%s is set but %s is not", envCutAt, envCutArm)
	}
	var armed, fired atomic.Bool
	var checked atomic.Int64 // unix nanoseconds of the last look for the arm file
	log.Warn("test fault point set: the process kills itself there once the arm file exists", "at", at, "arm", arm)
	return func(p store.FaultPoint) {
		if at != "either" && store.FaultPoint(at) != p {
			return
		}
		if !armed.Load() {
			now := time.Now().UnixNano()
			last := checked.Load()
			if now-last < int64(cutArmCheck) || !checked.CompareAndSwap(last, now) {
				return
			}
			if _, err := os.Stat(arm); err != nil {
				return
			}
			armed.Store(true)
		}
		if !fired.CompareAndSwap(false, true) {
			return
		}
		log.Warn("test fault point reached; killing the process", "at", string(p))
		kill()
	}, nil
}
