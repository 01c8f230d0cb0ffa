package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat
// (100 on every Linux architecture Go supports).
const clockTicks = 100

// buildService compiles ./cmd/telemetryd into dir and returns the path.
func buildService(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "telemetryd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/telemetryd/telemetryd/cmd/telemetryd")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build telemetryd: %w: %s", err, out)
	}
	return bin, nil
}

// service is telemetryd running as a child process with its embedded
// NATS server, on loopback ports chosen at start.
type service struct {
	bin       string
	dataDir   string
	logPath   string
	args      []string // extra flags, e.g. -sync-writes
	telemetry bool     // false sets OTEL_SDK_DISABLED=true
	pprofAddr string   // non-empty serves pprof there
	noMQTT    bool     // the binary predates -mqtt-listen

	httpAddr string
	natsAddr string
	mqttAddr string
	cmd      *exec.Cmd
	exited   chan struct{}
	client   *http.Client
}

// start launches the service and waits until /readyz answers 200; a
// service that does not get ready is killed. Its ports are picked free
// just before it binds them, so another process may take one first: a
// start that failed on an address in use is tried again on new ports.
func (s *service) start(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		var before int64
		if fi, err := os.Stat(s.logPath); err == nil {
			before = fi.Size()
		}
		err := s.startOnce(ctx)
		if err == nil || attempt == 3 || !s.logSays(before, "address already in use") {
			return err
		}
	}
}

// logSays reports whether the service's log, from offset on, contains text.
func (s *service) logSays(offset int64, text string) bool {
	b, err := os.ReadFile(s.logPath)
	if err != nil || int64(len(b)) < offset {
		return false
	}
	return bytes.Contains(b[offset:], []byte(text))
}

func (s *service) startOnce(ctx context.Context) error {
	var err error
	if s.httpAddr, err = freeAddr(); err != nil {
		return err
	}
	if s.natsAddr, err = freeAddr(); err != nil {
		return err
	}
	if s.mqttAddr, err = freeAddr(); err != nil {
		return err
	}
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := []string{"-data-dir", s.dataDir, "-http-addr", s.httpAddr, "-nats-listen", s.natsAddr, "-log-level", "warn"}
	if !s.noMQTT {
		args = append(args, "-mqtt-listen", s.mqttAddr)
	}
	args = append(args, s.args...)
	if !slices.Contains(s.args, "-sync-writes") {
		// The runs without -sync-writes measure mode buffered, the
		// baseline of every ratio (synced is the service's default).
		args = append(args, "-sync-writes=false")
	}
	if s.pprofAddr != "" {
		args = append(args, "-pprof-addr", s.pprofAddr)
	}
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Env = serviceEnv(os.Environ(), s.telemetry)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.exited)
	s.client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConnsPerHost: 16, DisableCompression: true}}
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		_ = s.cmd.Process.Kill() // a service that never got ready is not left behind
		<-s.exited
		s.cmd = nil
		return err
	}
	return nil
}

// serviceEnv is env without TELEMETRY_* and OTEL_SDK_DISABLED settings
// of the caller, plus OTEL_SDK_DISABLED=true when telemetry is off, so
// every run is configured by its flags alone.
func serviceEnv(env []string, telemetry bool) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if strings.HasPrefix(kv, "TELEMETRY_") || strings.HasPrefix(kv, "OTEL_SDK_DISABLED=") {
			continue
		}
		out = append(out, kv)
	}
	if !telemetry {
		out = append(out, "OTEL_SDK_DISABLED=true")
	}
	return out
}

func (s *service) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("telemetryd exited during start; see %s", s.logPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := s.client.Get(s.url("/readyz"))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("telemetryd not ready after %s; see %s", timeout, s.logPath)
}

// url is the address of path on the service's HTTP API.
func (s *service) url(path string) string { return "http://" + s.httpAddr + path }

// natsURL is the address of the service's embedded NATS server.
func (s *service) natsURL() string { return "nats://" + s.natsAddr }

// stop asks the service to shut down gracefully and waits, killing it
// after timeout.
func (s *service) stop(timeout time.Duration) error {
	if s.cmd == nil {
		return nil
	}
	defer func() { s.cmd = nil }()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		if code := s.cmd.ProcessState.ExitCode(); code != 0 {
			return fmt.Errorf("telemetryd exited with %d after SIGTERM; see %s", code, s.logPath)
		}
		return nil
	case <-time.After(timeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("telemetryd did not stop within %s of SIGTERM", timeout)
	}
}

// stored is the number of readings in the service's day tables, from
// GET /v1/tables.
func (s *service) stored(ctx context.Context) (int64, error) {
	var tr struct {
		Tables []struct {
			Readings int64 `json:"readings"`
		} `json:"tables"`
	}
	if err := s.getJSON(ctx, "/v1/tables", &tr); err != nil {
		return 0, err
	}
	var n int64
	for _, t := range tr.Tables {
		n += t.Readings
	}
	return n, nil
}

// getJSON decodes the JSON answer of GET path into v.
func (s *service) getJSON(ctx context.Context, path string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.url(path), nil)
	if err != nil {
		return err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body bytes.Buffer
	if _, err := body.ReadFrom(resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", path, resp.Status, bytes.TrimSpace(body.Bytes()))
	}
	return json.Unmarshal(body.Bytes(), v)
}

// procStats is what /proc says about a process.
type procStats struct {
	cpu   time.Duration // user + system time so far
	hwm   int64         // peak resident set size, bytes (VmHWM)
	rss   int64         // resident set size now, bytes (VmRSS)
	valid bool
}

// stats reads the service's CPU time and memory from /proc.
func (s *service) stats() (procStats, error) {
	if s.cmd == nil || s.cmd.Process == nil {
		return procStats{}, errors.New("service not running")
	}
	return readProcStats(s.cmd.Process.Pid)
}

// readProcStats reads utime+stime from /proc/<pid>/stat and VmHWM and
// VmRSS from /proc/<pid>/status.
func readProcStats(pid int) (procStats, error) {
	var st procStats
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, err
	}
	// The command name (field 2) may hold spaces; fields after it are
	// plain. utime and stime are fields 14 and 15.
	rest := string(raw[bytes.LastIndexByte(raw, ')')+1:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return st, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return st, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	st.cpu = time.Duration(utime+stime) * time.Second / clockTicks
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		name, val, ok := strings.Cut(line, ":")
		if !ok || (name != "VmHWM" && name != "VmRSS") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(val), " kB"), 10, 64)
		if err != nil {
			return st, fmt.Errorf("/proc/%d/status %s: %w", pid, name, err)
		}
		if name == "VmHWM" {
			st.hwm = kb << 10
		} else {
			st.rss = kb << 10
		}
	}
	st.valid = true
	return st, nil
}

// freeAddr returns a loopback address whose port was free a moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
