package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/rules"
	"github.com/telemetryd/telemetryd/ingest/ownership"
)

// alertProc is one telemetryd process of TestClusterAlertsSIGKILL.
type alertProc struct {
	name, base string
	cmd        *exec.Cmd
	exited     chan struct{}
}

// startAlertProc starts bin with args, its output in dir/<name>.log
// (shown when the test fails), and waits until it is ready.
func startAlertProc(t *testing.T, bin, dir, name, base string, args []string) *alertProc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	require.NoError(t, err)
	p := &alertProc{name: name, base: base, cmd: exec.Command(bin, args...), exited: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	require.NoError(t, p.cmd.Start())
	go func() { _ = p.cmd.Wait(); logf.Close(); close(p.exited) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("%s's log:\n%s", name, tail(b, 4000))
			}
		}
	})
	waitFor(t, 50*time.Millisecond, func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "%s never became ready", name)
	return p
}

// tail is the last n bytes of b.
func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// evalLog keeps every evaluation time of a group that each process
// reports as its lastEvaluation, polled more often than the group's
// interval, so no evaluation is missed while a process is alive.
type evalLog struct {
	mu   sync.Mutex
	at   map[string][]time.Time // process name → evaluation times, in order
	end  chan struct{}
	once sync.Once
	wg   sync.WaitGroup
}

func pollEvaluations(procs []*alertProc, group string, every time.Duration) *evalLog {
	l := &evalLog{at: map[string][]time.Time{}, end: make(chan struct{})}
	l.wg.Go(func() {
		tk := time.NewTicker(every)
		defer tk.Stop()
		for {
			select {
			case <-l.end:
				return
			case <-tk.C:
			}
			for _, p := range procs {
				at := groupLastEval(p.base, group)
				if at.IsZero() {
					continue
				}
				l.mu.Lock()
				if n := len(l.at[p.name]); n == 0 || !l.at[p.name][n-1].Equal(at) {
					l.at[p.name] = append(l.at[p.name], at)
				}
				l.mu.Unlock()
			}
		}
	})
	return l
}

func (l *evalLog) stop() { l.once.Do(func() { close(l.end) }); l.wg.Wait() }

// of returns the evaluation times seen on process name.
func (l *evalLog) of(name string) []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.at[name])
}

// TestClusterAlertsSIGKILL runs three telemetryd processes on a
// three-server NATS cluster with one rule group (interval 1 s, lease
// TTL 2 s) and a webhook receiver in the test, and SIGKILLs the process
// that evaluates the group: it neither releases its group lease nor
// saves anything more. One of the other two evaluates the group again
// within the lease TTL plus one interval of the killed process's last
// lease renewal or evaluation, no evaluation time is evaluated by two processes, and
// the alert is sent again at most once sooner than its resend delay
// (what the killed process may have sent without saving).
//
//	TELEMETRY_LONG=1 go test ./cmd/telemetryd -run TestClusterAlertsSIGKILL -v
func TestClusterAlertsSIGKILL(t *testing.T) {
	inLane(t, lanes.cluster)
	if !longCluster() {
		t.Skip("set TELEMETRY_LONG=1: builds the binary and runs three processes")
	}
	const (
		interval   = time.Second
		ttl        = 2 * time.Second
		partitions = 6
		copies     = 2
	)
	dir := t.TempDir()
	ruleFile := filepath.Join(dir, "fleet.yml")
	require.NoError(t, os.WriteFile(ruleFile, []byte(fmt.Sprintf(`groups:
  - name: fleet
    interval: %s
    rules:
      - alert: Heartbeat
        expr: vector(1)
`, interval)), 0o644))
	sink, hookURL := newWebhookSink(t)
	bin := filepath.Join(dir, "telemetryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	nc := startNATSCluster(t, 3)

	var procs []*alertProc
	var names []string
	for i := range 3 {
		name := fmt.Sprintf("node-%d", i)
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		base := "http://" + addr
		procs = append(procs, startAlertProc(t, bin, dir, name, base, []string{
			"-data-dir", filepath.Join(dir, name), "-http-addr", addr, "-nats-url", nc.urls(),
			"-partitions", strconv.Itoa(partitions), "-partition-streams=false", "-copies", strconv.Itoa(copies), "-node-name", name,
			"-advertise-url", base, "-cursor-key", testCursorKey, "-lease-ttl", ttl.String(),
			"-mqtt-listen", "", "-log-level", "info", "-rules", ruleFile, "-alert-webhook-url", hookURL}))
		names = append(names, name)
	}
	js := jsFor(t, nc.url(0))
	kv, err := js.KeyValue(context.Background(), ownership.DefaultBucket)
	require.NoError(t, err)
	waitFor(t, 100*time.Millisecond, func() bool { return leasesConverged(kv, names, partitions, copies, ttl) })

	evals := pollEvaluations(procs, "fleet", 20*time.Millisecond)
	defer evals.stop()
	// The evaluating process: the one with the newest evaluation once
	// the alert has been sent, and still evaluating.
	var victim *alertProc
	waitFor(t, 100*time.Millisecond, func() bool {
		if len(sink.of("Heartbeat", "firing")) == 0 {
			return false
		}
		var newest time.Time
		for _, p := range procs {
			if e := evals.of(p.name); len(e) >= 3 && e[len(e)-1].After(newest) {
				victim, newest = p, e[len(e)-1]
			}
		}
		return victim != nil && time.Since(newest) < interval
	}, "no process evaluates the group")

	require.NoError(t, victim.cmd.Process.Kill()) // SIGKILL
	<-victim.exited
	killedAt := time.Now()
	e, err := kv.Get(context.Background(), "nodes."+victim.name)
	require.NoError(t, err)
	var lease ownership.Lease
	require.NoError(t, json.Unmarshal(e.Value(), &lease))
	last := evals.of(victim.name)
	lastBefore := last[len(last)-1]

	// Another process takes the group over; let it evaluate a few
	// times more, so a duplicate notification has time to come.
	var next *alertProc
	var firstAfter time.Time
	waitFor(t, 50*time.Millisecond, func() bool {
		for _, p := range procs {
			if p == victim {
				continue
			}
			for _, at := range evals.of(p.name) {
				if at.After(lastBefore) && (firstAfter.IsZero() || at.Before(firstAfter)) {
					next, firstAfter = p, at
				}
			}
		}
		return next != nil
	}, "no other process evaluated the group after the kill")
	waitFor(t, 100*time.Millisecond, func() bool {
		e := evals.of(next.name)
		return e[len(e)-1].Sub(firstAfter) >= 3*interval
	}, "the group was not evaluated on after the takeover")
	evals.stop()

	t.Logf("%s evaluated the group last at %s and renewed its lease at %s; SIGKILL at %s; %s evaluated next at %s: %s after the last evaluation, %s after the renewal (lease TTL %s, interval %s)",
		victim.name, lastBefore.Format(time.TimeOnly+".000"), lease.Renewed.Format(time.TimeOnly+".000"),
		killedAt.Format(time.TimeOnly+".000"), next.name, firstAfter.Format(time.TimeOnly+".000"),
		firstAfter.Sub(lastBefore).Round(time.Millisecond), firstAfter.Sub(lease.Renewed).Round(time.Millisecond), ttl, interval)
	// The group's entry, renewed at every evaluation, keeps the group
	// for a lease TTL too: the bound runs from the later of the two.
	from := lease.Renewed
	if lastBefore.After(from) {
		from = lastBefore
	}
	assert.LessOrEqual(t, firstAfter.Sub(from), ttl+interval,
		"the group was not evaluated again within the lease TTL plus one interval of the killed process's last renewal or evaluation")

	// One process at a time: no evaluation time seen on two.
	by := map[time.Time][]string{}
	for _, p := range procs {
		for _, at := range evals.of(p.name) {
			by[at] = append(by[at], p.name)
		}
	}
	for at, who := range by {
		assert.Len(t, who, 1, "evaluation at %s by %v", at.Format(time.TimeOnly+".000"), who)
	}

	hb, early := assertOneAlertResentAtMostOnce(t, sink, "Heartbeat")
	t.Logf("webhook: Heartbeat firing %d times, %d of them sooner than the resend delay (%s)", len(hb), early, rules.DefaultResendDelay)
}
