package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
)

// service is telemetryd running as a child process on fixed loopback
// ports, so that a restarted instance is found at the same addresses.
type service struct {
	bin      string
	dataDir  string
	logPath  string
	httpAddr string
	natsAddr string
	mqttAddr string
	args     []string
	env      []string // added to the loop's environment
	armFile  string   // -cut-at: the file whose existence arms the fault point
	log      *slog.Logger
	// fsExited, when set, is closed when the file system under the data
	// dir went away (LazyFS exited): a start then ends at once with
	// errFSGone instead of waiting out its timeout.
	fsExited func() <-chan struct{}

	cmd    *exec.Cmd
	exited chan struct{}
	// durability is the mode the last ready /readyz reported.
	durability string

	mu      sync.Mutex  // guards running, for signals sent from other goroutines
	running *os.Process // the ready instance; nil while starting or killed
}

// buildService compiles ./cmd/telemetryd into dir.
func buildService(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "telemetryd")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/telemetryd/telemetryd/cmd/telemetryd")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build telemetryd: %w: %s", err, out)
	}
	return bin, nil
}

// freeAddr returns a loopback address with a port that was free a
// moment ago.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// wantDurability is the mode /readyz must report for the service's
// flags: buffered with -sync-writes=false, else synced (the default),
// which is store-synced on an external NATS server.
func (s *service) wantDurability() string {
	switch {
	case slices.Contains(s.args, "-sync-writes=false"):
		return "buffered"
	case slices.Contains(s.args, "-nats-url"):
		return "store-synced"
	}
	return "synced"
}

// start launches the service and waits until /readyz answers 200 and
// reports the durability mode its flags ask for.
func (s *service) start(ctx context.Context) error {
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	args := append([]string{"-data-dir", s.dataDir, "-http-addr", s.httpAddr, "-nats-listen", s.natsAddr,
		"-mqtt-listen", s.mqttAddr, "-log-format", "json", "-log-level", "warn"}, s.args...)
	s.cmd = exec.Command(s.bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	if len(s.env) > 0 {
		s.cmd.Env = append(os.Environ(), s.env...)
	}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	s.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(s.cmd, s.exited)
	if err := s.waitReady(ctx, 60*time.Second); err != nil {
		// A start that hangs holds the service's ports: the next try
		// would fail on them, not on what hung this one.
		_ = s.kill()
		return err
	}
	if want := s.wantDurability(); s.durability != want {
		_ = s.kill()
		return fmt.Errorf("telemetryd reports the durability mode %q, not %q: the loop would test another mode than it says", s.durability, want)
	}
	s.mu.Lock()
	s.running = s.cmd.Process
	s.mu.Unlock()
	return nil
}

// hup sends SIGHUP (reload the auth file) to the service if it is up
// and ready (before that, SIGHUP could end it before its handler is
// installed), and reports whether it did.
func (s *service) hup() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running != nil && s.running.Signal(syscall.SIGHUP) == nil
}

// notRunning stops hup from signalling the current instance.
func (s *service) notRunning() {
	s.mu.Lock()
	s.running = nil
	s.mu.Unlock()
}

// errFSGone: the file system under the data dir went away during a
// start (LazyFS exited).
var errFSGone = errors.New("the data dir's file system went away during the start (lazyfs exited)")

func (s *service) waitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := http.Client{Timeout: time.Second}
	var fsExited <-chan struct{}
	if s.fsExited != nil {
		fsExited = s.fsExited()
	}
	for time.Now().Before(deadline) {
		select {
		case <-s.exited:
			return fmt.Errorf("telemetryd exited during start; see %s", s.logPath)
		case <-fsExited:
			return errFSGone
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := client.Get("http://" + s.httpAddr + "/readyz")
		if err == nil {
			var ready struct {
				Durability string `json:"durability"`
			}
			derr := json.NewDecoder(resp.Body).Decode(&ready)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if derr != nil {
					return fmt.Errorf("/readyz: %w", derr)
				}
				s.durability = ready.Durability
				return nil
			}
		}
	}
	return fmt.Errorf("telemetryd not ready after %s; see %s", timeout, s.logPath)
}

// lastLogLine returns the last line of the service's log, which says
// why a start failed.
func (s *service) lastLogLine() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// kill SIGKILLs the service and waits for it to be gone.
func (s *service) kill() error {
	if s.cmd == nil {
		return errors.New("service not started")
	}
	s.notRunning()
	if err := s.cmd.Process.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	<-s.exited
	return nil
}

// stop asks the service to shut down gracefully, killing it after
// timeout.
func (s *service) stop(timeout time.Duration) error {
	if s.cmd == nil {
		return nil
	}
	s.notRunning()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		if code := s.cmd.ProcessState.ExitCode(); code != 0 {
			return fmt.Errorf("telemetryd exited with %d after SIGTERM; see %s", code, s.logPath)
		}
		return nil
	case <-time.After(timeout):
		_ = s.kill()
		return fmt.Errorf("telemetryd did not stop within %s of SIGTERM", timeout)
	}
}
