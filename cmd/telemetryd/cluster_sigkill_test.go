package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/cluster"
	"github.com/telemetryd/telemetryd/api/cluster/nodewire"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/exactlyonce"
	"github.com/telemetryd/telemetryd/ingest/ownership"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// leasesConverged reads the lease bucket as a node would and reports
// whether every partition is answered by exactly its desired owners
// among the given nodes.
func leasesConverged(kv jetstream.KeyValue, names []string, partitions, copies int, ttl time.Duration) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ready := map[string][]int{}
	for _, n := range names {
		e, err := kv.Get(ctx, "nodes."+n)
		if err != nil || time.Since(e.Created()) > ttl {
			return false
		}
		var l ownership.Lease
		if json.Unmarshal(e.Value(), &l) != nil {
			return false
		}
		ready[n] = l.Ready
	}
	keys, err := kv.Keys(ctx)
	if err != nil {
		return false
	}
	live := 0
	for _, k := range keys {
		if e, err := kv.Get(ctx, k); err == nil && time.Since(e.Created()) < ttl {
			live++
		}
	}
	if live != len(names) {
		return false
	}
	for p := range partitions {
		want := ownership.Rank(names, p)[:min(copies, len(names))]
		for _, n := range names {
			if slices.Contains(ready[n], p) != slices.Contains(want, n) {
				return false
			}
		}
	}
	return true
}

// TestClusterSIGKILL runs three telemetryd processes on an in-process
// NATS cluster and SIGKILLs one mid-ingest: no query for its devices
// fails through the others, its partitions get a second owner, it
// catches up when started again, and each copy then holds every acked
// reading exactly once.
//
//	TELEMETRY_LONG=1 go test ./cmd/telemetryd -run TestClusterSIGKILL -v
func TestClusterSIGKILL(t *testing.T) {
	inLane(t, lanes.cluster)
	if os.Getenv("TELEMETRY_LONG") == "" {
		t.Skip("set TELEMETRY_LONG=1: builds the binary and runs three processes")
	}
	const partitions, copies, devices = 12, 2, 120
	ttl := 2 * time.Second
	dir := t.TempDir()
	bin := filepath.Join(dir, "telemetryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	nc := startNATSCluster(t, 3)

	start := func(p *proc) { p.start(t, dir, bin) }
	var procs []*proc
	var names []string
	for i := range 3 {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		p := &proc{name: fmt.Sprintf("node-%d", i), base: "http://" + addr}
		p.args = []string{"-data-dir", filepath.Join(dir, p.name), "-http-addr", addr, "-nats-url", nc.urls(),
			"-partitions", strconv.Itoa(partitions), "-partition-streams=false", "-copies", strconv.Itoa(copies), "-node-name", p.name,
			"-advertise-url", p.base, "-cursor-key", testCursorKey, "-lease-ttl", ttl.String(),
			"-mqtt-listen", "", "-log-level", "info"}
		start(p)
		t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.exited })
		procs = append(procs, p)
		names = append(names, p.name)
	}
	js := jsFor(t, nc.url(0))
	kv, err := js.KeyValue(context.Background(), ownership.DefaultBucket)
	require.NoError(t, err)
	waitFor(t, 100*time.Millisecond, func() bool { return leasesConverged(kv, names, partitions, copies, ttl) })

	load := startLoad(t, []string{nc.url(0), nc.url(1), nc.url(2)}, "kill", devices, time.Now().UTC().Add(-time.Hour).Truncate(time.Second))
	waitFor(t, 20*time.Millisecond, func() bool { return load.rounds.Load() >= 10 })

	victim := procs[1]
	var victimDevs []string
	for i := range devices {
		if slices.Contains(ownership.Rank(names, partition.Of(partitions, load.device(i)))[:copies], victim.name) {
			victimDevs = append(victimDevs, load.device(i))
		}
	}
	require.NoError(t, victim.cmd.Process.Kill()) // SIGKILL
	<-victim.exited
	killed := time.Now()
	var failed, answered atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for k := 0; ; k++ {
			select {
			case <-stop:
				return
			default:
			}
			p := []*proc{procs[0], procs[2]}[k%2]
			resp, err := http.Get(p.base + "/v1/devices/" + victimDevs[k%len(victimDevs)] + "/readings/latest?limit=1")
			if err != nil || resp.StatusCode != 200 {
				failed.Add(1)
			} else {
				answered.Add(1)
			}
			if resp != nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	survivors := []string{names[0], names[2]}
	waitFor(t, 100*time.Millisecond, func() bool { return leasesConverged(kv, survivors, partitions, copies, ttl) })
	t.Logf("two caught-up owners per partition again %s after SIGKILL (lease TTL %s)", time.Since(killed).Round(time.Millisecond), ttl)
	close(stop)
	<-done
	assert.Zero(t, failed.Load(), "queries for the killed node's devices failed")
	t.Logf("%d queries for its devices answered meanwhile", answered.Load())

	start(victim)
	back := time.Now()
	waitFor(t, 100*time.Millisecond, func() bool { return leasesConverged(kv, names, partitions, copies, ttl) })
	t.Logf("the returned node caught up and owns its partitions again %s after it started", time.Since(back).Round(time.Millisecond))
	load.halt()

	// Each copy (asked directly through its node-to-node API) holds
	// every acked reading exactly once, and nothing unacked beyond what
	// was published.
	total := copiesHoldEveryAck(t, procs, names, partitions, copies, devices, load)
	t.Logf("both copies: %s", total)
	t.Logf("%d rounds of %d devices: 0 acked readings lost, 0 duplicated, on both copies", load.rounds.Load(), devices)
}

// internalCopy reads node base's own copy of dev through the
// node-to-node API (values in the nodewire encoding), with the cluster
// credential the nodes derive from testCursorKey, as a node without
// authentication calls it.
func internalCopy(base, dev string) ([]exactlyonce.Reading, error) {
	cfg := DefaultConfig()
	cfg.Security.CursorKey = testCursorKey
	credential, err := cfg.clusterCredential()
	if err != nil {
		return nil, err
	}
	body, _ := json.Marshal(map[string]any{"device": dev, "n": 100000})
	req, err := http.NewRequest(http.MethodPost, base+"/internal/v1/latest", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+credential)
	req.Header.Set(cluster.HeaderCaller, "open")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return nil, fmt.Errorf("copy of %s on %s: %d %s", dev, base, resp.StatusCode, b)
	}
	var page struct {
		Readings []struct {
			K int64  `json:"k"`
			V []byte `json:"v"`
		} `json:"readings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		return nil, fmt.Errorf("copy of %s on %s: %w", dev, base, err)
	}
	out := make([]exactlyonce.Reading, 0, len(page.Readings))
	for _, r := range page.Readings {
		vs, err := nodewire.DecodeValues(r.V)
		if err != nil {
			return nil, fmt.Errorf("copy of %s on %s: %w", dev, base, err)
		}
		out = append(out, checkerReading(buckets.Ticks(r.K), vs))
	}
	return out, nil
}

// copiesHoldEveryAck waits until each copy of every device of load,
// asked through the node-to-node API of its node, holds every acked
// reading exactly once and nothing never published, and returns the
// tally.
func copiesHoldEveryAck(t *testing.T, procs []*proc, names []string, partitions, copies, devices int, load *loadPublisher) exactlyonce.Tally {
	t.Helper()
	bases := map[string]string{}
	for _, p := range procs {
		bases[p.name] = p.base
	}
	var total exactlyonce.Tally
	var problem string
	run := load.run()
	waitFor(t, 500*time.Millisecond, func() bool {
		total, problem = exactlyonce.Tally{}, ""
		for i := range devices {
			dev := load.device(i)
			for _, o := range ownership.Rank(names, partition.Of(partitions, dev))[:copies] {
				got, err := internalCopy(bases[o], dev)
				if err != nil {
					problem = err.Error()
					return false
				}
				tally := run.Check(load.log.get(dev), got)
				total.Add(tally)
				if !tally.OK() && problem == "" {
					problem = fmt.Sprintf("%s on %s: %s", dev, o, tally)
				}
			}
		}
		return problem == ""
	}, "both copies hold every acked reading once and nothing never published")
	require.Empty(t, problem)
	return total
}

// proc is a telemetryd process of a cluster test, logging to
// <dir>/<name>.log.
type proc struct {
	name, base string
	args       []string
	cmd        *exec.Cmd
	exited     chan struct{}
}

// start runs bin with p's arguments and waits until it is ready.
func (p *proc) start(t *testing.T, dir, bin string) {
	t.Helper()
	logf, err := os.OpenFile(filepath.Join(dir, p.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	require.NoError(t, err)
	p.cmd = exec.Command(bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	require.NoError(t, p.cmd.Start())
	p.exited = make(chan struct{})
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.exited) }()
	waitFor(t, 50*time.Millisecond, func() bool {
		resp, err := http.Get(p.base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	}, "%s never became ready", p.name)
}
