package main

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// peerService is VictoriaMetrics (single-node, built from its source)
// running as a child process on a loopback port chosen at start.
type peerService struct {
	bin, dataDir, logPath string

	addr   string
	cmd    *exec.Cmd
	exited chan struct{}
	client *http.Client
}

// start launches the peer on dataDir and waits until GET /health
// answers 200; a peer that does not get healthy is killed.
func (p *peerService) start(ctx context.Context) error {
	var err error
	if p.addr, err = freeAddr(); err != nil {
		return err
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	p.cmd = exec.Command(p.bin, "-storageDataPath", p.dataDir, "-httpListenAddr", p.addr,
		"-loggerLevel", "WARN", "-retentionPeriod", "100y")
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.bin, err)
	}
	p.exited = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		_ = cmd.Wait()
		close(done)
	}(p.cmd, p.exited)
	p.client = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		MaxIdleConnsPerHost: 16, DisableCompression: true}}
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.exited:
			return fmt.Errorf("%s exited during start; see %s", p.bin, p.logPath)
		case <-ctx.Done():
			_ = p.cmd.Process.Kill()
			<-p.exited
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := p.client.Get(p.url("/health"))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	_ = p.cmd.Process.Kill()
	<-p.exited
	p.cmd = nil
	return fmt.Errorf("%s not healthy after a minute; see %s", p.bin, p.logPath)
}

// url is the address of path on the peer.
func (p *peerService) url(path string) string { return "http://" + p.addr + path }

// stop asks the peer to shut down gracefully (it flushes what it
// buffered) and waits, killing it after timeout.
func (p *peerService) stop(timeout time.Duration) error {
	if p.cmd == nil {
		return nil
	}
	defer func() { p.cmd = nil }()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return nil
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return fmt.Errorf("%s did not stop within %s of SIGTERM", p.bin, timeout)
	}
}

// stats reads the peer's CPU time and memory from /proc.
func (p *peerService) stats() (procStats, error) {
	if p.cmd == nil || p.cmd.Process == nil {
		return procStats{}, fmt.Errorf("peer not running")
	}
	return readProcStats(p.cmd.Process.Pid)
}
