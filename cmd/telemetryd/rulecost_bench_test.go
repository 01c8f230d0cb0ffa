package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// costRules writes n alerting rules at interval in groups of ten, five
// kinds over every device: a threshold on the last value, an average
// over five minutes, a silent device, a fleet's average and a low
// battery. About one device in a thousand is hot, so the threshold
// rules hold alerts.
func costRules(n int, interval time.Duration) string {
	var b strings.Builder
	b.WriteString("groups:\n")
	for i := range n {
		if i%10 == 0 {
			fmt.Fprintf(&b, "  - name: cost-%02d\n    interval: %s\n    rules:\n", i/10, interval)
		}
		var expr string
		switch i % 5 {
		case 0:
			expr = fmt.Sprintf("temp > %d", 50+i/5)
		case 1:
			expr = fmt.Sprintf("avg_over_time(temp[5m]) > %d", 45+i/5)
		case 2:
			expr = fmt.Sprintf("time() - telemetry_device_last_seen_timestamp_seconds > %d", 600+i)
		case 3:
			expr = fmt.Sprintf("avg by (fleet) (humidity) > %d", 80+i)
		case 4:
			expr = fmt.Sprintf("battery < %d", 1+i/20)
		}
		fmt.Fprintf(&b, "      - alert: Cost%03d\n        expr: %s\n        for: 1m\n        labels: {severity: warning}\n"+
			"        annotations: {summary: \"{{ $labels.device }} at {{ $value | humanize }}\"}\n", i, expr)
	}
	return b.String()
}

// gcTime is the CPU time the runtime estimates the garbage collector
// has taken so far (assists included).
func gcTime() time.Duration {
	s := []metrics.Sample{{Name: "/cpu/classes/gc/total:cpu-seconds"}}
	metrics.Read(s)
	return time.Duration(s[0].Value.Float64() * float64(time.Second))
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(t testing.TB) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestAlertRulesCost measures what 100 alerting rules at a 15 s
// interval over 10,000 devices cost at steady state, in one process
// with the same devices and the same writes every 15 s throughout: a
// window with the rules between a baseline before they are loaded and
// one after they are removed (one idle rule group in both). Each
// window runs under the CPU profiler. The rules' figure is the
// profile's: the share of the process's CPU time in the samples under
// a group's evaluation, plus the garbage collector's background
// workers' share beyond the baselines' mean; it fails above 5% of one
// core. It logs beside it
// the process's CPU time per second with the rules less the
// baselines' mean (the whole cost, but noisy), and the evaluations'
// wall time per round, from /api/v1/rules.
// TELEMETRY_ALERT_COST_PROFILE=FILE writes the profile of the window
// with the rules.
//
//	TELEMETRY_ALERT_COST=1 go test ./cmd/telemetryd -run TestAlertRulesCost -v -timeout 25m
func TestAlertRulesCost(t *testing.T) {
	if os.Getenv("TELEMETRY_ALERT_COST") == "" {
		t.Skip("set TELEMETRY_ALERT_COST=1: runs for about eight minutes")
	}
	const (
		devices  = 10000
		nRules   = 100
		interval = 15 * time.Second
		rounds   = 8 // intervals measured, each way
	)
	m, dir, write := newCostService(t, devices, interval)
	base := "http://" + m.HTTPAddr()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tk := time.NewTicker(interval)
		defer tk.Stop()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case now := <-tk.C:
				write(now.UTC(), i)
			}
		}
	})
	t.Cleanup(func() { close(stop); wg.Wait() })

	window := rounds * interval
	var ws []costWindow // baseline, rules, baseline again
	measure := func(what string) costWindow {
		var w costWindow
		g0 := gcTime()
		w.prof, w.raw = profileCPU(t, func() {
			c0, w0 := cpuTime(t), time.Now()
			time.Sleep(window)
			w.cpu, w.wall = cpuTime(t)-c0, time.Since(w0)
		})
		w.gc = gcTime() - g0
		t.Logf("%-14s %s CPU in %s: %.2f%% of one core (the profile's samples %.2f%%): the evaluations %.2f%%, the collector's workers %.2f%%",
			what+":", w.cpu.Round(time.Millisecond), w.wall.Round(time.Millisecond), w.pct(w.cpu),
			w.pct(w.prof.total()), w.share(fnGroupTick), w.share(fnGCWorker))
		ws = append(ws, w)
		return w
	}
	// The writer's first rounds, and the store settles what
	// newCostService loaded (its compaction is no part of either side).
	time.Sleep(2 * interval)
	measure("baseline")

	require.NoError(t, os.WriteFile(filepath.Join(dir, "cost.yml"), []byte(costRules(nRules, interval)), 0o644))
	require.NoError(t, m.alerts.Reload(context.Background()))
	// Steady state: every group evaluated again after the first
	// evaluations of all of them, which read from the store what the
	// live window keeps after (on a busy machine they take more than
	// an interval).
	first := waitCostEvaluations(t, base, time.Time{}, 20*interval)
	waitCostEvaluations(t, base, first, 20*interval)
	with := measure("rules")

	// Every rule evaluated without error; the threshold rules hold alerts.
	var nr, alerts int
	var round float64
	for _, g := range costGroups(t, base) {
		round += g.EvaluationTime
		for _, r := range g.Rules {
			nr++
			alerts += len(r.Alerts)
			assert.Equal(t, "ok", r.Health, "%s: %s", r.Name, r.LastError)
		}
	}
	require.Equal(t, nRules, nr)
	assert.Positive(t, alerts, "the threshold rules hold alerts")

	// The second baseline: the rules removed, their last evaluations
	// done. (The live window still follows the commits of the devices
	// it holds: 0.1% of a core, by the profile.)
	require.NoError(t, os.Remove(filepath.Join(dir, "cost.yml")))
	require.NoError(t, m.alerts.Reload(context.Background()))
	time.Sleep(interval)
	measure("baseline again")
	if profile := os.Getenv("TELEMETRY_ALERT_COST_PROFILE"); profile != "" {
		for i, suffix := range []string{".baseline", "", ".baseline-again"} {
			require.NoError(t, os.WriteFile(profile+suffix, ws[i].raw, 0o644))
		}
		t.Logf("CPU profiles of the window with the rules: %s; of the baselines: %[1]s.baseline, %[1]s.baseline-again", profile)
	}
	without := func(f func(costWindow) float64) float64 { return (f(ws[0]) + f(ws[2])) / 2 }
	process := with.pct(with.cpu) - without(func(w costWindow) float64 { return w.pct(w.cpu) })
	rest := with.rest() - without(costWindow.rest)
	evals := with.share(fnGroupTick)
	gcWith := with.share(fnGCWorker)
	gcMore := gcWith - without(func(w costWindow) float64 { return w.share(fnGCWorker) })
	// round is wall time, waits for the rule query slot included: it
	// is no measure of CPU (under load it grows while the CPU does not).
	t.Logf("%d rules over %d devices every %s: %d alerts held; the groups' last evaluations took %.0f ms of wall time together",
		nRules, devices, interval, alerts, round*1000)
	// The process's CPU less the baselines' is the whole cost, but the
	// writes, the store's compactions and the collector swing it by
	// about 2% of a core. The profile counts the process's own CPU
	// time, whatever else the machine runs: the evaluations' samples
	// are theirs alone (their allocations' assists to the collector
	// too), and the collector's background work on their garbage is
	// what its workers did beyond the baselines' mean.
	t.Logf("the rules cost %.2f%% of one core by the profile: the evaluations %.2f%% and the collector's workers %.2f%% more than without (%.2f%% with the rules, %.2f%% and %.2f%% without); with all the collector's work in the window %.2f%%",
		evals+gcMore, evals, gcMore, gcWith, ws[0].share(fnGCWorker), ws[2].share(fnGCWorker), evals+gcWith)
	t.Logf("the process's CPU with the rules less the baselines' mean: %.2f%% of one core; the runtime's estimate of the collector (its workers' wall time, assists, idle marking): %.2f%% with the rules, %.2f%% and %.2f%% without",
		process, with.pct(with.gc), ws[0].pct(ws[0].gc), ws[2].pct(ws[2].gc))
	t.Logf("the process's CPU less the store's background work and the writes (by the profile), with the rules less the baselines' mean: %.2f%% of one core (%.2f%% with, %.2f%% and %.2f%% without)",
		rest, with.rest(), ws[0].rest(), ws[2].rest())
	assert.LessOrEqual(t, evals+gcMore, 5.0, "the rules' share of one core, by the profile")
}

// costGroup is a group of TestAlertRulesCost, as /api/v1/rules shows it.
type costGroup struct {
	Name           string    `json:"name"`
	EvaluationTime float64   `json:"evaluationTime"`
	LastEvaluation time.Time `json:"lastEvaluation"`
	Rules          []struct {
		Name      string `json:"name"`
		Health    string `json:"health"`
		LastError string `json:"lastError"`
		Alerts    []any  `json:"alerts"`
	} `json:"rules"`
}

// costGroups returns the groups of TestAlertRulesCost the service at
// base evaluates.
func costGroups(t testing.TB, base string) []costGroup {
	t.Helper()
	var body struct {
		Data struct {
			Groups []costGroup `json:"groups"`
		} `json:"data"`
	}
	resp, err := http.Get(base + "/api/v1/rules")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	var gs []costGroup
	for _, g := range body.Data.Groups {
		if strings.HasPrefix(g.Name, "cost-") {
			gs = append(gs, g)
		}
	}
	return gs
}

// waitCostEvaluations waits until each of the ten groups of
// TestAlertRulesCost has finished an evaluation at a time after after,
// and returns the time it saw that at. It fails after limit.
func waitCostEvaluations(t testing.TB, base string, after time.Time, limit time.Duration) time.Time {
	t.Helper()
	for start := time.Now(); ; time.Sleep(time.Second) {
		gs := costGroups(t, base)
		done := len(gs) == 10
		for _, g := range gs {
			done = done && g.LastEvaluation.After(after)
		}
		if done {
			return time.Now()
		}
		require.Less(t, time.Since(start), limit, "the rule groups evaluated after %s", after)
	}
}

// The functions whose samples are the rules' in a profile of
// TestAlertRulesCost: a group's evaluation and the garbage collector's
// background workers.
const (
	fnGroupTick = "github.com/telemetryd/telemetryd/api/rules.(*group).tick"
	fnGCWorker  = "runtime.gcBgMarkWorker"
)

// The functions whose samples are the store's background work (its
// compactions, Badger's goroutines) or the test's writes: the same in
// every window, but their CPU swings by a few percent of a core.
var fnStoreWork = []string{
	"github.com/telemetryd/telemetryd/store.(*Store).compactor",
	"github.com/dgraph-io/badger/",
	"github.com/telemetryd/telemetryd/cmd/telemetryd.newCostService.func",
}

// costWindow is one measured window of TestAlertRulesCost.
type costWindow struct {
	cpu, wall time.Duration // the process's CPU time, and the wall time
	gc        time.Duration // the runtime's estimate of the collector's time
	prof      cpuProfile
	raw       []byte // prof as runtime/pprof wrote it
}

// pct is d in percent of one core over the window.
func (w costWindow) pct(d time.Duration) float64 { return 100 * d.Seconds() / w.wall.Seconds() }

// rest is the process's CPU in percent of one core less the share of
// the samples of fnStoreWork outside the evaluations.
func (w costWindow) rest() float64 {
	total := w.prof.total()
	if total == 0 {
		return w.pct(w.cpu)
	}
	return w.pct(w.cpu) * (1 - w.prof.outside(fnGroupTick, fnStoreWork...).Seconds()/total.Seconds())
}

// share is the CPU of the samples under fn, in percent of one core:
// their part of the profile's samples times the process's CPU time (the
// samples miss part of it, a tenth in the runs so far, as much under
// each function).
func (w costWindow) share(fn string) float64 {
	total := w.prof.total()
	if total == 0 {
		return 0
	}
	return w.pct(w.cpu) * w.prof.under(fn).Seconds() / total.Seconds()
}

// newCostService starts a service with an idle rule group in dir (the
// glob -rules reads) and devices in ten fleets with five minutes of
// readings every interval; write(at, round) writes one more round.
func newCostService(t testing.TB, devices int, interval time.Duration) (*Main, string, func(time.Time, int)) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rules")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "idle.yml"), []byte(`groups:
  - name: idle
    interval: 1h
    rules:
      - alert: Never
        expr: vector(0) > 1
`), 0o644))
	cfg := newTestConfig(t)
	cfg.Alerting.Rules = filepath.Join(dir, "*.yml")
	// Buffered writes: the fsyncs of synced ones cost the writer a few
	// percent of a core that swings by as much with the disk's other
	// users, and would drown the rules' cost in the difference.
	cfg.SyncWrites = false
	m := openMain(t, cfg, io.Discard, nil)

	// 10,000 devices in 10 fleets, writing every 15 s: six minutes of
	// history first, then a writer that keeps them current.
	var as []buckets.Assignment
	start := time.Now().UTC().Truncate(time.Second)
	for d := range devices {
		set, bad := buckets.NewAttributes(map[string]string{"fleet": "fleet-" + strconv.Itoa(d%10)})
		require.Nil(t, bad)
		as = append(as, buckets.Assignment{Device: costDevice(d), At: buckets.MustTicks(start.Add(-time.Hour)), Set: set})
	}
	require.NoError(t, m.store.Assign(context.Background(), as))
	write := func(at time.Time, round int) {
		rs := make([]buckets.Reading, 0, devices)
		k := buckets.MustTicks(at)
		for d := range devices {
			temp := 15 + float64((d*7+round)%200)/10
			if d%1000 == 0 {
				temp = 60
			}
			rs = append(rs, newReading(string(costDevice(d)), k,
				buckets.Field{Name: "temp", Value: buckets.Float(temp)},
				buckets.Field{Name: "humidity", Value: buckets.Float(40 + float64((d+round)%30))},
				buckets.Field{Name: "battery", Value: buckets.Float(100 - float64(d%90))}))
		}
		require.NoError(t, m.store.Write(context.Background(), rs))
	}
	loaded := time.Now()
	for i := 24; i > 0; i-- {
		write(start.Add(-time.Duration(i)*interval), -i)
	}
	t.Logf("%d devices, 24 readings each, written in %s", devices, time.Since(loaded).Round(time.Millisecond))
	return m, dir, write
}

func costDevice(d int) buckets.DeviceID { return buckets.DeviceID(fmt.Sprintf("cold-%05d", d)) }

// BenchmarkAlertRulesRound is one interval of TestAlertRulesCost
// (100 rules over 10,000 devices): every device writes a reading, then
// each of the ten groups evaluates at its own offset in the interval,
// as their tickers spread them, after one such round that is not
// measured (it reads from the store what the rules keep in memory
// after). cpu-%-at-15s is the process's CPU during the evaluations
// per 15 s of wall time (the writes not counted; the garbage collector
// counted as it runs then), gc-%-at-15s the runtime's estimate of the
// garbage collector's share of it, and B/op the bytes allocated then
// (the rules' garbage, and the store's background work).
//
//	go test ./cmd/telemetryd -run '^$' -bench BenchmarkAlertRulesRound -benchtime 10x -cpuprofile /tmp/rules.prof
//
// TELEMETRY_ALERT_COST_DEVICES=N changes the number of devices.
func BenchmarkAlertRulesRound(b *testing.B) {
	const nRules = 100
	devices := 10000
	if n, err := strconv.Atoi(os.Getenv("TELEMETRY_ALERT_COST_DEVICES")); err == nil && n > 0 {
		devices = n // a smaller fleet for a quick profile
	}
	const interval = 15 * time.Second
	m, dir, write := newCostService(b, devices, interval)
	// An interval of an hour: the groups' own tickers stay out of the way.
	require.NoError(b, os.WriteFile(filepath.Join(dir, "cost.yml"), []byte(costRules(nRules, time.Hour)), 0o644))
	require.NoError(b, m.alerts.Reload(context.Background()))
	ctx := context.Background()
	at := time.Now().UTC().Truncate(time.Second)
	round := func(i int) (time.Duration, time.Duration) {
		ts := at.Add(time.Duration(i) * interval)
		b.StopTimer()
		write(ts, i)
		b.StartTimer()
		c0, g0 := cpuTime(b), gcTime()
		for g := range nRules / 10 {
			offset := time.Duration(g)*interval/10 + time.Second
			require.NoError(b, m.alerts.Manager.EvalAt(ctx, fmt.Sprintf("cost-%02d", g), ts.Add(offset)))
		}
		return cpuTime(b) - c0, gcTime() - g0
	}
	round(0) // steady state: the first evaluations read what the rules need from the store
	b.ReportAllocs()
	b.ResetTimer()
	var cpu, gc time.Duration
	for i := 1; b.Loop(); i++ {
		c, g := round(i)
		cpu, gc = cpu+c, gc+g
	}
	b.ReportMetric(100*cpu.Seconds()/float64(b.N)/interval.Seconds(), "cpu-%-at-15s")
	b.ReportMetric(100*gc.Seconds()/float64(b.N)/interval.Seconds(), "gc-%-at-15s")
}
