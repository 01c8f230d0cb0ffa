package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// natsConfigEnv, when set, makes the harness binary (or its test
// binary) a NATS server: it runs the configuration file it names until
// SIGTERM. The harness starts its NATS servers this way, each inside
// its namespace, so that no nats-server binary is needed.
const natsConfigEnv = "TELEMETRY_FAULTS_NATS_CONFIG"

// runNATSServer runs the NATS server of the configuration file path
// until SIGTERM or SIGINT.
func runNATSServer(path string) error {
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		return fmt.Errorf("nats config %s: %w", path, err)
	}
	opts.NoSigs = false
	ns, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	ns.ConfigureLogger()
	if err := server.Run(ns); err != nil {
		return err
	}
	ns.WaitForShutdown()
	return nil
}

// proc is one process of the cluster (a NATS server or a telemetryd
// node) inside its namespace, restartable with the same arguments.
type proc struct {
	name    string
	member  int // the namespace
	net     *network
	bin     string
	args    []string
	env     []string
	logPath string
	dataDir string // what a power cut or a damaged file hits

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool     // SIGSTOPped
	killed  bool     // SIGKILL sent (a process still running then hangs in the kernel)
	notes   []string // what the operator did to it since last taken (operator.go)
}

// note records what the operator did to p.
func (p *proc) note(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.notes = append(p.notes, s)
}

// takeNotes returns and forgets p's notes.
func (p *proc) takeNotes() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.notes
	p.notes = nil
	return out
}

// start launches the process; it does not wait for it to be ready.
func (p *proc) start() error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := p.net.command(p.member, p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a ctrl-C of the harness reaches the
	// harness only, which then stops its processes in order.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited, p.stopped, p.killed = cmd, exited, false, false
	p.mu.Unlock()
	return nil
}

// pid is the process's id, 0 before its first start.
func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// running reports whether the process is up (paused counts).
func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s not started", p.name)
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signal %s: %w", p.name, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		p.stopped = true
	case syscall.SIGCONT:
		p.stopped = false
	case syscall.SIGKILL:
		p.killed = true
	}
	return nil
}

// kill SIGKILLs the process and waits for it to be gone. A process
// whose threads hang in the kernel (a FUSE file system that stopped
// answering) cannot finish exiting: after killWait kill gives up and
// says so.
func (p *proc) kill() error {
	if !p.running() {
		return nil
	}
	_ = p.signal(syscall.SIGKILL)
	select {
	case <-p.exited:
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("%s did not exit within %s of SIGKILL: a thread hangs in the kernel (with -lazyfs: is LazyFS's cache full? see -lazyfs-cache)", p.name, killWait)
	}
}

const killWait = time.Minute

// hung reports whether the process was sent SIGKILL and has not exited:
// a thread of it waits in the kernel (on a FUSE file system that does
// not answer).
func (p *proc) hung() bool {
	p.mu.Lock()
	killed := p.killed
	p.mu.Unlock()
	return killed && p.running()
}

// waitExit waits up to d for the process to be gone.
func (p *proc) waitExit(d time.Duration) bool {
	p.mu.Lock()
	exited := p.exited
	p.mu.Unlock()
	if exited == nil {
		return true
	}
	select {
	case <-exited:
		return true
	case <-time.After(d):
		return false
	}
}

// stop sends SIGTERM (SIGCONT first, should it be paused) and kills it
// after timeout.
func (p *proc) stop(timeout time.Duration) {
	if !p.running() {
		return
	}
	_ = p.signal(syscall.SIGCONT)
	_ = p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(timeout):
		_ = p.kill()
	}
}

// lastLines is the end of the process's log, which says why it failed.
func (p *proc) lastLines(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// natsConfig is the configuration of NATS server i of n on the network:
// JetStream clustered over routes, fsync before every ack (the durable
// mode), 8 MiB payloads, and with partitions > 0 the mapping of a
// device's subject to its partition's stream (deploy/CLUSTER.md).
func natsConfig(net *network, i, n int, storeDir string, partitions int) string {
	var routes []string
	for j := range n {
		routes = append(routes, fmt.Sprintf("%q", "nats://"+net.memberAddr(j)+":6222"))
	}
	mapping := ""
	if partitions > 0 {
		// A stream per partition (deploy/nats-cluster.conf).
		mapping = fmt.Sprintf("mappings: { \"telemetry.*\": \"telemetry.{{partition(%d,1)}}.{{wildcard(1)}}\" }\n", partitions)
	}
	return mapping + fmt.Sprintf(`server_name: nats-%d
listen: "%s:4222"
max_payload: 8MB
prof_port: %d
jetstream {
  store_dir: %q
  sync_interval: always
}
cluster {
  name: telemetry-faults
  listen: "%s:6222"
  routes: [%s]
}
`, i, net.memberAddr(i), natsProfPort, storeDir, net.memberAddr(i), strings.Join(routes, ", "))
}

// natsProfPort is where each NATS server serves Go's pprof (goroutine
// dumps of a server that stalls: http://<its address>:6060/debug/pprof/).
const natsProfPort = 6060

// newNATSProc prepares NATS server i (namespace i), its configuration
// and log under work, its store under disk.
func newNATSProc(net *network, self string, i, n int, work, disk string, partitions int) (*proc, error) {
	d := filepath.Join(work, fmt.Sprintf("nats-%d", i))
	store := filepath.Join(disk, fmt.Sprintf("nats-%d", i), "store")
	if err := os.MkdirAll(store, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(d, "nats.conf")
	if err := os.WriteFile(cfgPath, []byte(natsConfig(net, i, n, store, partitions)), 0o644); err != nil {
		return nil, err
	}
	return &proc{name: fmt.Sprintf("nats-%d", i), member: i, net: net, bin: self,
		env: []string{natsConfigEnv + "=" + cfgPath}, logPath: filepath.Join(d, "log"), dataDir: store}, nil
}

// nodeURL is node j's HTTP base URL.
func nodeURL(net *network, member int) string { return "http://" + net.memberAddr(member) + ":8080" }

// newNodeProc prepares telemetryd node j in namespace member, its log
// under work, its data dir under disk.
func newNodeProc(net *network, cfg Config, j, member int, natsURLs, work, disk string) (*proc, error) {
	d := filepath.Join(work, fmt.Sprintf("node-%d", j))
	data := filepath.Join(disk, fmt.Sprintf("node-%d", j), "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	args := []string{"-data-dir", data, "-http-addr", net.memberAddr(member) + ":8080",
		"-nats-url", natsURLs, "-partitions", fmt.Sprint(cfg.Partitions), "-copies", fmt.Sprint(cfg.Copies),
		"-node-name", fmt.Sprintf("node-%d", j), "-advertise-url", nodeURL(net, member),
		"-lease-ttl", cfg.LeaseTTL.String(), "-stream-replicas", "3", "-cursor-key", cursorKey,
		"-sync-writes", "-insecure", "-log-format", "json", "-log-level", "info",
		"-partition-streams=" + fmt.Sprint(cfg.PartitionStreams)}
	return &proc{name: fmt.Sprintf("node-%d", j), member: member, net: net, bin: cfg.Binary,
		args: append(args, cfg.NodeArgs...), logPath: filepath.Join(d, "log"), dataDir: data}, nil
}

// cursorKey is the -cursor-key every node shares.
const cursorKey = "telemetry-faults-cursor-key-0123456789abcdef"

// waitReady polls url's /readyz until 200. A node that advises
// repairing a day table is not waited for: its error is a
// *repairNeeded (cluster.readyRepairing runs the repair).
func waitReady(ctx context.Context, p *proc, base string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	c := http.Client{Timeout: 2 * time.Second}
	for time.Now().Before(deadline) {
		if !p.running() {
			return fmt.Errorf("%s exited during start: %s", p.name, p.lastLines(3))
		}
		resp, err := c.Get(base + "/readyz")
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			if rn := advisedRepairs(body); rn != nil && resp.StatusCode == http.StatusServiceUnavailable {
				return fmt.Errorf("%s not ready: %w", p.name, rn)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s not ready after %s: %s", p.name, timeout, p.lastLines(3))
}

// clusterView is what GET /v1/cluster says.
type clusterView struct {
	Nodes []struct {
		Node     string    `json:"node"`
		URL      string    `json:"url"`
		Ready    []int     `json:"ready"`
		Holding  []int     `json:"holding"`
		Trailing []int     `json:"trailing"`
		Renewed  time.Time `json:"renewed"`
	} `json:"nodes"`
	Layout []struct {
		Partition int      `json:"partition"`
		Owners    []string `json:"owners"`
		CaughtUp  []string `json:"caughtUp"`
	} `json:"layout"`
}

func getClusterView(ctx context.Context, c *http.Client, base string) (clusterView, error) {
	var v clusterView
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/cluster", nil)
	if err != nil {
		return v, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return v, fmt.Errorf("GET %s/v1/cluster: %s", base, resp.Status)
	}
	return v, json.NewDecoder(resp.Body).Decode(&v)
}
