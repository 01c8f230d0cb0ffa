// Package preflight holds the start-up checks that run before any part
// of the service opens a file or a port, so that what stops it is named
// by the flag that fixes it: every listener address that cannot be
// bound (all of them at once, not only the first) and a data dir the
// service cannot write.
package preflight

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/telemetryd/telemetryd/cmd/internal/security"
)

// portErrors are the listeners that cannot be bound, said on one line.
type portErrors []error

// Error joins the listeners' errors with "; ".
func (e portErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

// Unwrap lets errors.Is see each listener's error.
func (e portErrors) Unwrap() []error { return e }

// Listeners binds the fixed port of each listener (the HTTP API, which
// also takes line protocol writes and serves /metrics; pprof; the
// embedded NATS server's client and MQTT ports), all at once, and lets
// them go again; a random port (0 or -1) cannot be
// taken. Each that cannot be bound is named with its flag, e.g.
// "-http-addr 127.0.0.1:8080: address already in use (another process
// holds it: stop it, or choose another address with -http-addr)". Two
// listeners given the same port are caught the same way.
func Listeners(ls []security.Listener) error {
	var errs portErrors
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			_ = ln.Close()
		}
	}()
	for _, l := range ls {
		if l.Addr == "" {
			continue // off
		}
		_, port, err := net.SplitHostPort(l.Addr)
		if err != nil {
			continue // Validate or the listener itself names a malformed address
		}
		if n, err := strconv.Atoi(port); err == nil && n <= 0 {
			continue
		}
		ln, err := net.Listen("tcp", l.Addr)
		if err != nil {
			errs = append(errs, listenError(l, err))
			continue
		}
		held = append(held, ln)
	}
	if len(errs) == 0 {
		return nil
	}
	return errs
}

// listenError names l's flag and the fix for err.
func listenError(l security.Listener, err error) error {
	var sys *os.SyscallError
	cause := err
	if errors.As(err, &sys) {
		cause = sys.Err
	}
	switch {
	case errors.Is(err, syscall.EADDRINUSE):
		return fmt.Errorf("%s %s: %w (another process holds it: stop it, or choose another address with %s)", l.Flag, l.Addr, cause, l.Flag)
	case errors.Is(err, syscall.EACCES):
		return fmt.Errorf("%s %s: %w (ports below 1024 need privileges: choose a higher port with %s)", l.Flag, l.Addr, cause, l.Flag)
	}
	return fmt.Errorf("%s %s: %w", l.Flag, l.Addr, cause)
}

// DataDir makes the data dir when it is missing and proves that
// the service can write in it, before anything opens a file there. A
// dir it cannot use is refused naming -data-dir and what to do.
func DataDir(dir string) error {
	const fix = "give the user telemetryd runs as write access to it, or choose another directory with -data-dir"
	if fi, err := os.Stat(dir); err == nil && !fi.IsDir() {
		return fmt.Errorf("-data-dir %s is a file, not a directory: choose a directory with -data-dir", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("-data-dir %s cannot be created (%w): %s", dir, pathCause(err), fix)
	}
	f, err := os.CreateTemp(dir, ".write-check-*")
	if err != nil {
		return fmt.Errorf("-data-dir %s is not writable (%w): %s", dir, pathCause(err), fix)
	}
	name := f.Name()
	err = f.Close()
	if rerr := os.Remove(name); err == nil {
		err = rerr
	}
	if err != nil {
		return fmt.Errorf("-data-dir %s is not writable (%w): %s", dir, pathCause(err), fix)
	}
	return nil
}

// pathCause is the reason of a file system error without the path,
// which the caller names already ("permission denied").
func pathCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
