package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/ingest"
	ingestcluster "github.com/telemetryd/telemetryd/ingest/cluster"
	"github.com/telemetryd/telemetryd/ingest/ownership"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// streamsPartitions is the partition count of the tests of a stream per
// partition in a cluster: no NATS server may lead more than
// ceil(6/3)+1 = 3 of their streams.
const streamsPartitions = 6

// setPartitionMapping replaces o's global account with one that maps
// the devices' subjects to n partitions (a fresh account: a restarted
// server must not reuse the stopped one's).
func setPartitionMapping(o *server.Options, n int) {
	g := server.NewAccount(server.DEFAULT_GLOBAL_ACCOUNT)
	src, dst := partition.Mapping("telemetry", n)
	if err := g.AddMapping(src, dst); err != nil {
		panic(err)
	}
	o.Accounts = []*server.Account{g}
}

// streamNodeConfig is node i of a cluster with a stream per partition,
// connected to every NATS server so that it fails over.
func streamNodeConfig(t *testing.T, nc *natsCluster, i int, streams bool) Config {
	t.Helper()
	cfg := clusterNodeConfig(t, nc, i, streamsPartitions)
	cfg.NATSURL = nc.urls()
	cfg.Cluster.PartitionStreams = streams
	require.NoError(t, cfg.Validate())
	return cfg
}

// leaderCounts is how many partition streams each NATS server leads.
func leaderCounts(t *testing.T, js jetstream.JetStream) map[string]int {
	t.Helper()
	var names []string
	for p := range streamsPartitions {
		names = append(names, partition.Stream("TELEMETRY", p))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ls, err := ingestcluster.Leaders(ctx, js, names)
	if err != nil {
		return nil
	}
	for _, l := range ls {
		if l.Leader == "" {
			return nil
		}
	}
	return ingestcluster.LeaderCounts(ls)
}

// spread reports whether no server leads more than ceil(P/3)+1 streams
// (and every stream has a leader).
func spread(counts map[string]int) bool {
	if counts == nil {
		return false
	}
	for _, n := range counts {
		if n > (streamsPartitions+2)/3+1 {
			return false
		}
	}
	return true
}

// ackedAt is an acked reading with the time its ack arrived.
type ackedAt struct {
	dev string
	n   int
	at  time.Time
}

// answerProbe asks, for each acked reading it is given, the live nodes
// in turn until one answers it (a node routes the query to a caught-up
// owner), and keeps the longest time from the ack to that answer.
type answerProbe struct {
	start   time.Time
	live    atomic.Pointer[[]string] // base URLs of the nodes up
	in      chan ackedAt
	wg      sync.WaitGroup
	mu      sync.Mutex
	max     time.Duration
	maxOf   ackedAt
	probed  atomic.Int64
	dropped atomic.Int64
}

func startAnswerProbe(start time.Time, bases []string) *answerProbe {
	p := &answerProbe{start: start, in: make(chan ackedAt, 256)}
	p.setLive(bases)
	client := &http.Client{Timeout: 5 * time.Second}
	for range 4 {
		p.wg.Go(func() {
			for a := range p.in {
				ts := p.start.Add(time.Duration(a.n) * time.Second).UnixMilli()
				for k := 0; ; k++ {
					bases := *p.live.Load()
					url := bases[k%len(bases)] + "/v1/devices/" + a.dev + "/readings/" + strconv.FormatInt(ts, 10)
					resp, err := client.Get(url)
					if err == nil {
						resp.Body.Close()
						if resp.StatusCode == http.StatusOK {
							break
						}
					}
					time.Sleep(5 * time.Millisecond)
				}
				d := time.Since(a.at)
				p.probed.Add(1)
				p.mu.Lock()
				if d > p.max {
					p.max, p.maxOf = d, a
				}
				p.mu.Unlock()
			}
		})
	}
	return p
}

func (p *answerProbe) setLive(bases []string) { p.live.Store(&bases) }

// offer probes a if a worker is free soon; else it is left out (and
// counted), so the probe never slows the publisher.
func (p *answerProbe) offer(a ackedAt) {
	select {
	case p.in <- a:
	default:
		p.dropped.Add(1)
	}
}

func (p *answerProbe) halt() (time.Duration, ackedAt) {
	close(p.in)
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.max, p.maxOf
}

// startTimedLoad is startLoad with one acked reading of each round
// (of each device in turn) offered to probe at its ack time.
func startTimedLoad(t *testing.T, urls []string, devices int, start time.Time, probe *answerProbe) *loadPublisher {
	t.Helper()
	var conns []jetstream.JetStream
	var ncs []*nats.Conn
	for _, u := range urls {
		nc, err := nats.Connect(u, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
		require.NoError(t, err)
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		conns = append(conns, js)
		ncs = append(ncs, nc)
	}
	p := &loadPublisher{log: &ackedLog{acked: map[string][]int{}}, prefix: "ps", devices: devices, start: start,
		stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for r := 0; ; r++ {
			select {
			case <-p.stop:
				return
			default:
			}
			var acks []jetstream.PubAckFuture
			var devs []string
			for i := range devices {
				dev := p.device(i)
				ts := start.Add(time.Duration(r) * time.Second).UnixMilli()
				k := (r + i) % len(conns)
				if ncs[k].Status() != nats.CONNECTED {
					continue // its server is down: not sent, not promised
				}
				a, err := conns[k].PublishAsync("telemetry."+dev, fmt.Appendf(nil, `{"ts":%d,"n":%d}`, ts, r))
				if err != nil {
					continue // not acked: not promised
				}
				acks = append(acks, a)
				devs = append(devs, dev)
			}
			probe1 := p.device(r % devices) // a device of each partition in turn
			// Closed, not sent once: every ack still waited for after
			// 10 s is given up (one lost with a server never comes).
			late := make(chan struct{})
			timer := time.AfterFunc(10*time.Second, func() { close(late) })
			for k, a := range acks {
				select {
				case <-a.Ok():
					p.log.add(devs[k], r)
					if devs[k] == probe1 {
						probe.offer(ackedAt{dev: devs[k], n: r, at: time.Now()})
					}
				case <-a.Err():
				case <-late: // not acked within 10 s: not promised
				}
			}
			timer.Stop()
			p.rounds.Add(1)
			time.Sleep(20 * time.Millisecond)
		}
	}()
	return p
}

// TestClusterPartitionStreams: three NATS servers and three nodes with
// 6 partitions. The cluster starts on the one stream and is upgraded to
// -partition-streams (see upgradeFromOneStream). Each partition then
// has an R3 stream of its own; the leader of the leases spreads their
// leaders (no server leads more than ceil(6/3)+1 = 3), also after they
// were all moved to one server and after a server returns; GET
// /v1/cluster and /readyz show them. While devices publish, a node is
// killed and comes back, then a NATS server is shut down and comes
// back: every acked reading is stored exactly once on each of its
// owners and answered through every node; the longest time from an ack
// to the first answer of its reading is printed. It takes 2-3 minutes,
// so it runs with TELEMETRY_LONG=1:
//
//	TELEMETRY_LONG=1 go test ./cmd/telemetryd -run 'TestClusterPartitionStreams$' -v
func TestClusterPartitionStreams(t *testing.T) {
	inLane(t, lanes.cluster)
	if !longCluster() {
		t.Skip("set TELEMETRY_LONG=1: a cluster on streams per partition through a node crash, a NATS server's shutdown and an upgrade (2-3 minutes)")
	}
	nc := startNATSCluster(t, 3)
	clock := testClock()
	var nodes []*testNode
	top := t
	if !t.Run("upgrade from the one stream", func(t *testing.T) { nodes = upgradeFromOneStream(t, top, nc, clock) }) {
		t.FailNow()
	}
	var names, bases []string
	for _, n := range nodes {
		names = append(names, n.cfg.Cluster.NodeName)
		bases = append(bases, n.base)
	}
	js := jsFor(t, nc.url(0))
	for p := range streamsPartitions {
		st, err := js.Stream(context.Background(), partition.Stream("TELEMETRY", p))
		require.NoError(t, err)
		assert.Equal(t, 3, st.CachedInfo().Config.Replicas)
		assert.Equal(t, []string{partition.Subjects("telemetry", p)}, st.CachedInfo().Config.Subjects)
	}

	t.Run("leaders spread", func(t *testing.T) {
		waitFor(t, 100*time.Millisecond, func() bool { return spread(leaderCounts(t, js)) },
			"the partition streams' leaders never spread")
		// All on one server: the balancer spreads them again.
		ncc, err := nats.Connect(nc.url(0))
		require.NoError(t, err)
		defer ncc.Close()
		for p := range streamsPartitions {
			name := partition.Stream("TELEMETRY", p)
			waitFor(t, 50*time.Millisecond, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				st, err := js.Stream(ctx, name)
				if err == nil && st.CachedInfo().Cluster != nil && st.CachedInfo().Cluster.Leader == "nats-0" {
					return true
				}
				_ = ingestcluster.StepDown(ctx, ncc, name, "nats-0")
				return false
			}, "stream %s never moved to nats-0", name)
		}
		t.Logf("every stream led by nats-0: %v", leaderCounts(t, js))
		waitFor(t, 100*time.Millisecond, func() bool { return spread(leaderCounts(t, js)) },
			"the balancer never spread the leaders of one server")
		t.Logf("spread again: %v", leaderCounts(t, js))
		// GET /v1/cluster lists every partition's stream with its leader,
		// /readyz names them.
		for _, n := range nodes {
			code, body := getBody(t, n.base+"/readyz")
			require.Equal(t, http.StatusOK, code, body)
			var ready api.Status
			require.NoError(t, json.Unmarshal([]byte(body), &ready))
			assert.Equal(t, []string{"TELEMETRY_0", "TELEMETRY_1", "TELEMETRY_2", "TELEMETRY_3", "TELEMETRY_4", "TELEMETRY_5"}, ready.Streams)
		}
		for _, n := range nodes {
			code, body := getBody(t, n.base+"/v1/cluster")
			require.Equal(t, http.StatusOK, code, body)
			var st api.ClusterStatus
			require.NoError(t, json.Unmarshal([]byte(body), &st))
			require.Len(t, st.Streams, streamsPartitions, body)
			for p, s := range st.Streams {
				assert.Equal(t, partition.Stream("TELEMETRY", p), s.Stream)
				assert.Contains(t, []string{"nats-0", "nats-1", "nats-2"}, s.Leader, body)
				assert.Len(t, s.Replicas, 2, body)
			}
		}
	})

	t.Run("line protocol writes go to the partitions' streams", func(t *testing.T) {
		var body strings.Builder
		ts := testEpoch.Add(-30 * time.Minute).UnixNano()
		for i := range 30 {
			fmt.Fprintf(&body, "climate,device=lp-%02d temp=%d %d\n", i, i, ts)
		}
		resp, err := http.Post(nodes[1].base+"/api/v2/write?bucket=b&org=o", "text/plain", strings.NewReader(body.String()))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNoContent, resp.StatusCode)
		byName := map[string]*testNode{}
		for _, n := range nodes {
			byName[n.cfg.Cluster.NodeName] = n
		}
		waitFor(t, 50*time.Millisecond, func() bool {
			for i := range 30 {
				dev := fmt.Sprintf("lp-%02d", i)
				for _, o := range nodes[0].main().cluster.members.Desired(partition.Of(streamsPartitions, dev)) {
					if storedOn(t, byName[o].main(), dev) != 1 {
						return false
					}
				}
			}
			return true
		}, "every written line stored once on both owners of its device")
	})

	t.Run("a node killed and a NATS server shut down while devices publish", func(t *testing.T) {
		// A round's readings are a second after the last round's, and a
		// quiet machine runs 40 rounds a second: a day of room, so that
		// no reading goes past the accepted future skew.
		start := testEpoch.Add(-24 * time.Hour).Truncate(time.Second)
		probe := startAnswerProbe(start, bases)
		load := startTimedLoad(t, []string{nc.url(0), nc.url(1), nc.url(2)}, 60, start, probe)
		rounds := func(n int64) {
			from := load.rounds.Load()
			waitFor(t, 20*time.Millisecond, func() bool { return load.rounds.Load() >= from+n })
		}
		rounds(10)

		victim := nodes[1]
		probe.setLive([]string{nodes[0].base, nodes[2].base})
		victim.crash()
		killed := time.Now()
		survivors := []string{names[0], names[2]}
		waitFor(t, 50*time.Millisecond, func() bool { return converged(nodes[0].main(), 2, survivors) },
			"the killed node's partitions never got a second owner")
		t.Logf("two caught-up owners per partition %s after the kill", time.Since(killed).Round(time.Millisecond))
		rounds(10)
		victim.open(clock)
		probe.setLive(bases)
		for _, n := range nodes {
			waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) },
				"the returned node never owned its partitions again")
		}
		rounds(10)

		nc.stop(2)
		stopped := time.Now()
		// Its streams' leaders move to the other two, and devices go on
		// publishing through them for a while.
		waitFor(t, 100*time.Millisecond, func() bool {
			c := leaderCounts(t, js)
			return c != nil && c["nats-2"] == 0
		}, "the streams nats-2 led never got another leader")
		rounds(50)
		setPartitionMapping(nc.opts[2], streamsPartitions)
		nc.start(2)
		t.Logf("nats-2 down for %s", time.Since(stopped).Round(time.Millisecond))
		rounds(20)
		waitFor(t, 100*time.Millisecond, func() bool {
			c := leaderCounts(t, js)
			return spread(c) && c["nats-2"] > 0
		}, "the leaders never spread to the returned server")
		t.Logf("leaders after nats-2 returned: %v", leaderCounts(t, js))
		load.halt()
		longest, of := probe.halt()

		// An owner whose consumer could not show its position for 10 s
		// (the raft groups electing after the shutdown) withdraws the
		// partition until it can: the probe above measured what that
		// cost; the copies are compared once every owner answers again.
		for _, n := range nodes {
			waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) },
				"%s never saw every partition answered by its two owners again", n.cfg.Cluster.NodeName)
		}
		total := checkCopies(t, nodes, load, streamsPartitions, 5*time.Minute)
		t.Logf("%d rounds of %d devices; every copy: %s", load.rounds.Load(), load.devices, total)
		require.Positive(t, probe.probed.Load())
		t.Logf("ack to first answer through the nodes: longest %s (%s reading %d), over %d acked readings probed (%d left out while the probes were busy)",
			longest.Round(time.Millisecond), of.dev, of.n, probe.probed.Load(), probe.dropped.Load())
	})
}

// upgradeFromOneStream: a cluster on the one stream TELEMETRY
// (partitioned by its subject transform) holds readings its nodes
// stored and readings published while every node was down. The NATS
// servers then map the devices' subjects to partitions and the nodes
// start with -partition-streams: the old stream is drained into every
// owner's store and deleted, new readings go to the partitions'
// streams, and every acked reading is on each of its owners exactly
// once. It returns the upgraded nodes, which top closes.
func upgradeFromOneStream(t, top *testing.T, nc *natsCluster, clock func() time.Time) []*testNode {
	var cfgs []Config
	var nodes []*testNode
	var names []string
	for i := range 3 {
		cfg := streamNodeConfig(top, nc, i, false) // its data dir outlives this step
		cfgs = append(cfgs, cfg)
		nodes = append(nodes, startNode(t, cfg, clock))
		names = append(names, cfg.Cluster.NodeName)
	}
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}
	start := testEpoch.Add(-time.Hour).Truncate(time.Second)
	load := &loadPublisher{log: &ackedLog{acked: map[string][]int{}}, prefix: "up", devices: 40, start: start}
	js := jsFor(t, nc.url(0))
	publish := func(from, to int) {
		for r := from; r < to; r++ {
			var acks []jetstream.PubAckFuture
			for i := range load.devices {
				ts := start.Add(time.Duration(r) * time.Second).UnixMilli()
				a, err := js.PublishAsync("telemetry."+load.device(i), fmt.Appendf(nil, `{"ts":%d,"n":%d}`, ts, r))
				require.NoError(t, err)
				acks = append(acks, a)
			}
			for i, a := range acks {
				select {
				case <-a.Ok():
					load.log.add(load.device(i), r)
				case err := <-a.Err():
					t.Fatalf("publish %s %d: %v", load.device(i), r, err)
				}
			}
			load.rounds.Add(1)
		}
	}
	publish(0, 5)
	old, err := js.Stream(context.Background(), "TELEMETRY")
	require.NoError(t, err)
	waitFor(t, 100*time.Millisecond, func() bool {
		for _, n := range nodes {
			for p := range streamsPartitions {
				if !slices.Contains(n.main().cluster.members.Desired(p), n.cfg.Cluster.NodeName) {
					continue
				}
				ci, err := js.Consumer(context.Background(), "TELEMETRY", ingestcluster.ConsumerName(n.cfg.Cluster.NodeName, p))
				if err != nil || ci.CachedInfo().NumPending+uint64(ci.CachedInfo().NumAckPending) > 0 {
					return false
				}
			}
		}
		return true
	}, "the first readings stored by the one-stream cluster")
	for _, n := range nodes {
		n.close()
	}
	publish(5, 10) // into the old stream, with no node running
	info, err := old.Info(context.Background())
	require.NoError(t, err)
	require.Equal(t, uint64(10*load.devices), info.State.Msgs)

	// The servers map the subjects now; the nodes start on streams per
	// partition.
	src, dst := partition.Mapping("telemetry", streamsPartitions)
	for _, s := range nc.servers {
		require.NoError(t, s.GlobalAccount().AddMapping(src, dst))
	}
	nodes = nil
	for i := range 3 {
		cfgs[i].Cluster.PartitionStreams = true
		nodes = append(nodes, startNode(top, cfgs[i], clock)) // they outlive this step
	}
	publish(10, 15)        // into the partitions' streams
	var consumers []string // of the old stream, for the failure's message
	defer func() {
		if t.Failed() {
			t.Logf("consumers of the old stream at the last look: %v", consumers)
		}
	}()
	waitFor(t, 100*time.Millisecond, func() bool {
		st, err := js.Stream(context.Background(), "TELEMETRY")
		if err != nil {
			return errors.Is(err, jetstream.ErrStreamNotFound)
		}
		consumers = nil
		for ci := range st.ListConsumers(context.Background()).Info() {
			consumers = append(consumers, fmt.Sprintf("%s: %d pending, %d unacked", ci.Name, ci.NumPending, ci.NumAckPending))
		}
		return false
	}, "the old stream was never deleted")
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool { return converged(n.main(), 2, names) })
	}
	var inNew uint64
	for p := range streamsPartitions {
		st, err := js.Stream(context.Background(), partition.Stream("TELEMETRY", p))
		require.NoError(t, err)
		inNew += st.CachedInfo().State.Msgs
	}
	assert.Equal(t, uint64(5*load.devices), inNew, "the new readings are in the partitions' streams")
	total := checkCopies(t, nodes, load, streamsPartitions, 2*time.Minute)
	t.Logf("%d readings of %d devices across the upgrade; every copy: %s", load.rounds.Load()*int64(load.devices), load.devices, total)
	return nodes
}

// TestDeployPartitionMapping: the NATS servers of the compose and
// Kubernetes clusters, started from their shipped configuration, map
// every partition of the nodes' TELEMETRY_PARTITIONS to its stream (the
// check a node with -partition-streams runs at start), and the nodes
// are started with -partition-streams.
func TestDeployPartitionMapping(t *testing.T) {
	inLane(t, lanes.general)
	type configMap struct {
		Kind     string `yaml:"kind"`
		Metadata struct {
			Name string `yaml:"name"`
		} `yaml:"metadata"`
		Data map[string]string `yaml:"data"`
	}
	var k8sConf string
	var k8sEnv map[string]string
	for _, o := range yamlDocs[configMap](t, "k8s-cluster/nats.yaml") {
		if o.Kind == "ConfigMap" && o.Metadata.Name == "nats-config" {
			k8sConf = o.Data["nats.conf"]
		}
	}
	for _, o := range yamlDocs[configMap](t, "k8s-cluster/telemetryd.yaml") {
		if o.Kind == "ConfigMap" && o.Data["TELEMETRY_PARTITIONS"] != "" {
			k8sEnv = o.Data
		}
	}
	require.NotEmpty(t, k8sConf)
	require.NotNil(t, k8sEnv)
	assert.Equal(t, "true", k8sEnv["TELEMETRY_PARTITION_STREAMS"])
	k8sParts, err := strconv.Atoi(k8sEnv["TELEMETRY_PARTITIONS"])
	require.NoError(t, err)

	compose := string(readDeploy(t, "compose-cluster.yaml"))
	m := regexp.MustCompile(`TELEMETRY_PARTITIONS: "(\d+)"`).FindStringSubmatch(compose)
	require.NotNil(t, m)
	composeParts, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	assert.Regexp(t, `TELEMETRY_PARTITION_STREAMS: "true"`, compose)

	for _, c := range []struct {
		name, conf string
		partitions int
	}{
		{"compose", string(readDeploy(t, "nats-cluster.conf")), composeParts},
		{"kubernetes", k8sConf, k8sParts},
	} {
		t.Run(c.name, func(t *testing.T) {
			var o server.Options
			require.NoError(t, o.ProcessConfigString(c.conf))
			o.Host, o.Port, o.JetStream, o.StoreDir, o.NoSigs = "127.0.0.1", -1, true, t.TempDir(), true
			ns, err := server.NewServer(&o)
			require.NoError(t, err)
			ns.Start()
			t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
			require.True(t, ns.ReadyForConnections(10*time.Second))
			js := jsFor(t, ns.ClientURL())
			icfg := ingest.DefaultConfig()
			icfg.Partitions, icfg.PartitionStreams = c.partitions, true
			icfg.StreamMaxBytes = 16 << 20
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			require.NoError(t, ingest.CheckMapping(ctx, js, icfg))
		})
	}
}

// TestClusterPartitionStreamsSIGKILL is the scenario of
// TestClusterPartitionStreams with three telemetryd processes, the
// node SIGKILLed:
//
//	TELEMETRY_LONG=1 go test ./cmd/telemetryd -run TestClusterPartitionStreamsSIGKILL -v
func TestClusterPartitionStreamsSIGKILL(t *testing.T) {
	inLane(t, lanes.cluster)
	if !longCluster() {
		t.Skip("set TELEMETRY_LONG=1: builds the binary and runs three processes")
	}
	const copies, devices = 2, 120
	ttl := 2 * time.Second
	dir := t.TempDir()
	bin := filepath.Join(dir, "telemetryd")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)
	nc := startNATSCluster(t, 3, func(_ int, o *server.Options) { setPartitionMapping(o, streamsPartitions) })

	start := func(p *proc) { p.start(t, dir, bin) }
	var procs []*proc
	var names, bases []string
	for i := range 3 {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		p := &proc{name: fmt.Sprintf("node-%d", i), base: "http://" + addr}
		p.args = []string{"-data-dir", filepath.Join(dir, p.name), "-http-addr", addr, "-nats-url", nc.urls(),
			"-partitions", strconv.Itoa(streamsPartitions), "-partition-streams", "-copies", strconv.Itoa(copies),
			"-node-name", p.name, "-advertise-url", p.base, "-cursor-key", testCursorKey, "-lease-ttl", ttl.String(),
			"-mqtt-listen", "", "-log-level", "info"}
		start(p)
		t.Cleanup(func() { _ = p.cmd.Process.Kill(); <-p.exited })
		procs = append(procs, p)
		names = append(names, p.name)
		bases = append(bases, p.base)
	}
	js := jsFor(t, nc.url(0))
	kv, err := js.KeyValue(context.Background(), ownership.DefaultBucket)
	require.NoError(t, err)
	waitFor(t, 100*time.Millisecond, func() bool { return leasesConverged(kv, names, streamsPartitions, copies, ttl) })
	waitFor(t, 100*time.Millisecond, func() bool { return spread(leaderCounts(t, js)) }, "the leaders never spread")

	begin := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Second) // a day of rounds (see above)
	probe := startAnswerProbe(begin, bases)
	load := startTimedLoad(t, []string{nc.url(0), nc.url(1), nc.url(2)}, devices, begin, probe)
	rounds := func(n int64) {
		from := load.rounds.Load()
		waitFor(t, 20*time.Millisecond, func() bool { return load.rounds.Load() >= from+n })
	}
	rounds(10)

	victim := procs[1]
	probe.setLive([]string{procs[0].base, procs[2].base})
	require.NoError(t, victim.cmd.Process.Kill()) // SIGKILL
	<-victim.exited
	killed := time.Now()
	waitFor(t, 100*time.Millisecond, func() bool {
		return leasesConverged(kv, []string{names[0], names[2]}, streamsPartitions, copies, ttl)
	})
	t.Logf("two caught-up owners per partition again %s after SIGKILL (lease TTL %s)", time.Since(killed).Round(time.Millisecond), ttl)
	start(victim)
	probe.setLive(bases)
	waitFor(t, 100*time.Millisecond, func() bool { return leasesConverged(kv, names, streamsPartitions, copies, ttl) })
	rounds(10)

	nc.stop(2)
	waitFor(t, 100*time.Millisecond, func() bool {
		c := leaderCounts(t, js)
		return c != nil && c["nats-2"] == 0
	}, "the streams nats-2 led never got another leader")
	rounds(100)
	setPartitionMapping(nc.opts[2], streamsPartitions)
	nc.start(2)
	waitFor(t, 100*time.Millisecond, func() bool {
		c := leaderCounts(t, js)
		return spread(c) && c["nats-2"] > 0
	}, "the leaders never spread to the returned server")
	rounds(20)
	load.halt()
	longest, of := probe.halt()

	total := copiesHoldEveryAck(t, procs, names, streamsPartitions, copies, devices, load)
	t.Logf("%d rounds of %d devices; both copies: %s", load.rounds.Load(), devices, total)
	t.Logf("ack to first answer through the nodes: longest %s (%s reading %d), over %d acked readings probed (%d left out while the probes were busy)",
		longest.Round(time.Millisecond), of.dev, of.n, probe.probed.Load(), probe.dropped.Load())
}
