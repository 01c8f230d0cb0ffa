package main

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/exactlyonce"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// visibleWithin is how soon after its publish was acked a reading is
// answered by every node of a healthy cluster. The long run holds the
// cluster to it; the short one, which must pass on a busy machine (at
// load 17, beside a fault run and the package's other tests, the
// slowest reading took 22 s), to stallLimit, the ack wait: a delivered
// message that is never settled is delivered again only once the ack
// wait has passed, so a reading answered sooner was not stalled,
// however slow the machine.
const (
	visibleWithin = 2 * time.Second
	stallLimit    = 30 * time.Second
)

// ackedReading is one reading whose publish JetStream acked, and when
// each of its partition's owners first had it.
type ackedReading struct {
	dev   string
	ticks buckets.Ticks
	acked time.Time
	seen  map[string]time.Time // owner → when its store first had it
}

// visibility watches the owners' stores for acked readings.
type visibility struct {
	mu      sync.Mutex
	pending []*ackedReading // not yet seen on every owner
	done    []*ackedReading
}

func (v *visibility) add(r *ackedReading) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.pending = append(v.pending, r)
}

// sweep reads, for every device with pending readings, each owner's
// copy over the span of the readings it has not been seen with (one
// range query), the owners in parallel, and records when each reading
// was first found.
func (v *visibility) sweep(t *testing.T, owners func(dev string) []*testNode) {
	t.Helper()
	type job struct {
		dev string
		rs  []*ackedReading // not yet seen on the node
	}
	jobs := map[*testNode]map[string]*job{}
	v.mu.Lock()
	for _, r := range v.pending {
		for _, n := range owners(r.dev) {
			if _, ok := r.seen[n.cfg.Cluster.NodeName]; ok {
				continue
			}
			if jobs[n] == nil {
				jobs[n] = map[string]*job{}
			}
			j := jobs[n][r.dev]
			if j == nil {
				j = &job{dev: r.dev}
				jobs[n][r.dev] = j
			}
			j.rs = append(j.rs, r)
		}
	}
	v.mu.Unlock()
	var wg sync.WaitGroup
	for n, byDev := range jobs {
		st, name := n.main().store, n.cfg.Cluster.NodeName
		wg.Go(func() {
			for _, j := range byDev {
				from, to := j.rs[0].ticks, j.rs[0].ticks
				for _, r := range j.rs {
					from, to = min(from, r.ticks), max(to, r.ticks)
				}
				page, err := st.Range(context.Background(), buckets.RangeQuery{Device: buckets.DeviceID(j.dev),
					From: from, To: to + 1, Order: buckets.Asc, Limit: 10000})
				if err != nil {
					t.Errorf("read %s on %s: %v", j.dev, name, err)
					return
				}
				now := time.Now()
				have := map[buckets.Ticks]bool{}
				for _, r := range page.Readings {
					have[r.Ticks] = true
				}
				v.mu.Lock()
				for _, r := range j.rs {
					if have[r.ticks] {
						r.seen[name] = now
					}
				}
				v.mu.Unlock()
			}
		})
	}
	wg.Wait()
	v.mu.Lock()
	defer v.mu.Unlock()
	var left []*ackedReading
	for _, r := range v.pending {
		if len(r.seen) == len(owners(r.dev)) {
			v.done = append(v.done, r)
		} else {
			left = append(left, r)
		}
	}
	v.pending = left
}

// late returns the readings not seen on every owner within d of their
// ack, as of now.
func (v *visibility) late(d time.Duration) []*ackedReading {
	v.mu.Lock()
	defer v.mu.Unlock()
	now := time.Now()
	var out []*ackedReading
	for _, r := range v.pending {
		if now.Sub(r.acked) > d {
			out = append(out, r)
		}
	}
	for _, r := range v.done {
		for _, at := range r.seen {
			if at.Sub(r.acked) > d {
				out = append(out, r)
				break
			}
		}
	}
	return out
}

// delays returns how long after its ack each settled reading was first
// on all its owners, sorted.
func (v *visibility) delays() []time.Duration {
	v.mu.Lock()
	defer v.mu.Unlock()
	var out []time.Duration
	for _, r := range v.done {
		var last time.Time
		for _, at := range r.seen {
			if at.After(last) {
				last = at
			}
		}
		out = append(out, last.Sub(r.acked))
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// TestClusterNoStall: three NATS JetStream servers, three nodes with
// -partitions 12 -copies 2, 1,000 devices. After a burst of 20,000
// readings, a pause of a second and a wave paced at 1,500 readings/s,
// every acked reading is stored by both owners of its partition (so
// answered through every node) within stallLimit of its ack (no
// delivered message waits out the ack wait to be delivered again), and
// then every node answers every acked reading through its API.
// TELEMETRY_LONG=1 repeats it five times.
//
//	go test ./cmd/telemetryd -run TestClusterNoStall -v
func TestClusterNoStall(t *testing.T) {
	inLane(t, lanes.cluster)
	const devices, burst, rate = 1000, 20000, 1500
	wave := 5 * time.Second
	reps, limit := 1, stallLimit
	if longCluster() {
		reps, limit = 5, visibleWithin
	}
	nc := startNATSCluster(t, 3)
	clock := testClock()
	var nodes []*testNode
	var names []string
	for i := range 3 {
		cfg := clusterNodeConfig(t, nc, i, 12)
		nodes = append(nodes, startNode(t, cfg, clock))
		names = append(names, cfg.Cluster.NodeName)
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}
	byName := map[string]*testNode{}
	for _, n := range nodes {
		byName[n.cfg.Cluster.NodeName] = n
	}
	owners := func(dev string) []*testNode {
		var out []*testNode
		for _, o := range nodes[0].main().cluster.members.Desired(partition.Of(12, dev)) {
			out = append(out, byName[o])
		}
		return out
	}
	conns := []jetstream.JetStream{jsFor(t, nc.url(0)), jsFor(t, nc.url(1)), jsFor(t, nc.url(2))}
	device := func(i int) string { return fmt.Sprintf("stall-%04d", i) }
	base := testEpoch.Add(-2 * time.Hour)

	v := &visibility{}
	stop := make(chan struct{})
	swept := make(chan struct{})
	go func() {
		defer close(swept)
		for {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			began := time.Now()
			v.sweep(t, owners)
			if d := time.Since(began); d > time.Second {
				t.Logf("a look at the owners' stores took %s", d.Round(time.Millisecond))
			}
		}
	}()
	defer func() { close(stop); <-swept }()

	// publish sends n readings (device k%devices, reading number k/devices
	// from first on) paced at perSecond (0: as fast as acks come back)
	// and records each ack.
	type sent struct {
		f  jetstream.PubAckFuture
		ar *ackedReading
	}
	next := 0
	publish := func(n, perSecond int) {
		t.Helper()
		acks := make(chan sent, 4096)
		collected := make(chan struct{})
		go func() {
			defer close(collected)
			for s := range acks {
				select {
				case <-s.f.Ok():
					s.ar.acked = time.Now()
					v.add(s.ar)
				case err := <-s.f.Err():
					t.Errorf("publish of %s: %v", s.ar.dev, err)
				}
			}
		}()
		began := time.Now()
		for j := range n {
			k := next + j
			dev := device(k % devices)
			ts := base.Add(time.Duration(k/devices) * time.Second)
			f, err := conns[k%len(conns)].PublishAsync("telemetry."+dev, fmt.Appendf(nil, `{"ts":%d,"n":%d}`, ts.UnixMilli(), k/devices))
			require.NoError(t, err)
			acks <- sent{f: f, ar: &ackedReading{dev: dev, ticks: buckets.MustTicks(ts), seen: map[string]time.Time{}}}
			if perSecond > 0 {
				if ahead := time.Duration(j+1)*time.Second/time.Duration(perSecond) - time.Since(began); ahead > 0 {
					time.Sleep(ahead)
				}
			}
		}
		next += n
		close(acks)
		<-collected
	}

	for rep := range reps {
		publish(burst, 0)
		time.Sleep(time.Second)
		publish(int(wave.Seconds())*rate, rate)
		// Every acked reading settles or outlives the limit.
		waitFor(t, 100*time.Millisecond, func() bool {
			v.mu.Lock()
			defer v.mu.Unlock()
			if len(v.pending) == 0 {
				return true
			}
			for _, r := range v.pending {
				if time.Since(r.acked) <= limit {
					return false
				}
			}
			return true
		})
		d := v.delays()
		late := v.late(limit)
		if len(d) > 0 {
			t.Logf("round %d: %d readings on both owners; after their ack: median %s, p99 %s, max %s; %d later than %s",
				rep+1, len(d), d[len(d)/2].Round(time.Millisecond), d[len(d)*99/100].Round(time.Millisecond),
				d[len(d)-1].Round(time.Millisecond), len(v.late(visibleWithin)), visibleWithin)
		}
		v.mu.Lock()
		for i, r := range late {
			if i == 10 {
				break
			}
			var missing []string
			for _, o := range owners(r.dev) {
				if at, ok := r.seen[o.cfg.Cluster.NodeName]; !ok || at.Sub(r.acked) > limit {
					missing = append(missing, fmt.Sprintf("%s (partition %d, seen %v)", o.cfg.Cluster.NodeName,
						partition.Of(12, r.dev), at.Sub(r.acked).Round(time.Millisecond)))
				}
			}
			t.Logf("late: %s at %s acked %s ago, late on %v", r.dev, r.ticks.Time().Format(time.TimeOnly),
				time.Since(r.acked).Round(time.Millisecond), missing)
		}
		v.mu.Unlock()
		if len(late) > 0 {
			// How late: wait for the stragglers (a redelivery after the
			// ack wait), then report.
			waitFor(t, 100*time.Millisecond, func() bool {
				v.mu.Lock()
				defer v.mu.Unlock()
				return len(v.pending) == 0 || time.Since(late[0].acked) > stallLimit+15*time.Second
			})
			d := v.delays()
			t.Logf("the last settled %s after its ack", d[len(d)-1].Round(time.Millisecond))
		}
		require.Empty(t, late, "acked readings not answered by every owner within %s", limit)
	}
	// Through the API of every node: every acked reading.
	v.mu.Lock()
	acked := map[string][]time.Time{}
	for _, r := range append(slices.Clone(v.done), v.pending...) {
		acked[r.dev] = append(acked[r.dev], r.ticks.Time())
	}
	v.mu.Unlock()
	from, to := base.Add(-time.Second), base.Add(time.Duration(next/devices+1)*time.Second)
	for _, n := range nodes {
		for dev, want := range acked {
			got, err := exactlyonce.ReadDevice(context.Background(), nil, n.base, dev, from, to, nil)
			require.NoError(t, err, "%s through %s", dev, n.cfg.Cluster.NodeName)
			have := map[int64]bool{}
			for _, r := range got {
				have[r.TS.UnixMilli()] = true
			}
			for _, ts := range want {
				require.True(t, have[ts.UnixMilli()], "%s at %s through %s", dev, ts, n.cfg.Cluster.NodeName)
			}
		}
	}
}
