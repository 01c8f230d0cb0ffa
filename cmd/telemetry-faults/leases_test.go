package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/lazyfs"
	"github.com/telemetryd/telemetryd/ingest/ownership"
)

// TestLeaseBucketAfterPowerCutOfAll: three NATS servers (the durable
// mode: every write fsynced before its ack), each on a LazyFS mount of
// its own, hold the lease bucket with three replicas while a node renews
// its lease; then the power of all three is cut (SIGKILL, every write
// not fsynced dropped) and they start again after longer than the lease
// TTL. The bucket must take the node's lease again.
//
// In a fault run (cmd/telemetry-faults on LazyFS, seed 4040) the
// bucket, then with the lease TTL as its MaxAge, did not: each replica
// restored no message, asked for a catch-up, found no leader and
// replayed its snapshot, for minutes. This test alone has not brought
// that about (it passed with the MaxAge too): there the three servers
// and three nodes were loaded, and the servers had been cut, paused and
// partitioned before.
//
// It needs LazyFS (TELEMETRY_LAZYFS) and root (FUSE mounts), and takes
// about three minutes: the servers snapshot their logs every two.
func TestLeaseBucketAfterPowerCutOfAll(t *testing.T) {
	bin, log := lazyFSForTest(t)
	ctx := t.Context()
	dir := t.TempDir()
	var mounts []*lazyfs.FS
	for i := range servers {
		fs, err := lazyfs.NewSized(bin, filepath.Join(dir, fmt.Sprintf("lazyfs-%d", i)), filepath.Join(dir, fmt.Sprintf("disk-%d", i)), "128mb", log)
		require.NoError(t, err)
		require.NoError(t, fs.Mount(ctx))
		mounts = append(mounts, fs)
	}
	c := &loopbackNATS{t: t, dir: dir}
	for i := range servers {
		c.clients = append(c.clients, freePort(t))
		c.routes = append(c.routes, freePort(t))
		c.stores = append(c.stores, filepath.Join(mounts[i].Mnt, "store"))
	}
	// The servers go before their mounts.
	t.Cleanup(func() {
		c.kill()
		for _, m := range mounts {
			_ = m.Close()
		}
	})
	c.start()

	ttl := time.Second
	cfg := ownership.Config{Node: "node-0", URL: "http://node-0", Partitions: 6, LeaseTTL: ttl, Replicas: servers}
	m, err := ownership.New(c.connect(), cfg)
	require.NoError(t, err)
	require.NoError(t, openWithin(ctx, m, time.Minute), "open the lease bucket")
	// Renewals, as a node makes them, past the servers' first snapshot
	// of the bucket's log.
	for end := time.Now().Add(150 * time.Second); time.Now().Before(end); {
		m.Sync(ctx)
		time.Sleep(ttl / 3)
	}

	c.kill()
	for _, fs := range mounts {
		require.NoError(t, fs.Cut(ctx))
	}
	time.Sleep(3 * ttl)
	c.start()
	m, err = ownership.New(c.connect(), cfg)
	require.NoError(t, err)
	require.NoError(t, openWithin(ctx, m, 2*time.Minute), "open the lease bucket after the power cut of every server (logs: %s)", dir)
}

// openWithin opens m, trying again until it succeeds or d has passed;
// it returns the last error.
func openWithin(ctx context.Context, m *ownership.Membership, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := m.Open(octx)
		cancel()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// loopbackNATS is three NATS server processes on loopback (the test
// binary serves as one, see TestMain), clustered over routes, every
// write fsynced, each on its own store directory, killed with SIGKILL.
type loopbackNATS struct {
	t       *testing.T
	dir     string
	stores  []string
	clients []int
	routes  []int
	procs   []*exec.Cmd
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (c *loopbackNATS) start() {
	c.t.Helper()
	var routes []string
	for _, p := range c.routes {
		routes = append(routes, fmt.Sprintf("%q", fmt.Sprintf("nats://127.0.0.1:%d", p)))
	}
	for i := range c.stores {
		conf := fmt.Sprintf("server_name: nats-%d\nlisten: \"127.0.0.1:%d\"\njetstream { store_dir: %q, sync_interval: always }\ncluster { name: leases, listen: \"127.0.0.1:%d\", routes: [%s] }\n",
			i, c.clients[i], c.stores[i], c.routes[i], strings.Join(routes, ", "))
		path := filepath.Join(c.dir, fmt.Sprintf("nats-%d.conf", i))
		require.NoError(c.t, os.WriteFile(path, []byte(conf), 0o644))
		logf, err := os.OpenFile(filepath.Join(c.dir, fmt.Sprintf("nats-%d.log", i)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		require.NoError(c.t, err)
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), natsConfigEnv+"="+path)
		cmd.Stdout, cmd.Stderr = logf, logf
		require.NoError(c.t, cmd.Start())
		logf.Close()
		c.procs = append(c.procs, cmd)
	}
}

func (c *loopbackNATS) kill() {
	for _, p := range c.procs {
		_ = p.Process.Kill()
		_ = p.Wait()
	}
	c.procs = nil
}

func (c *loopbackNATS) connect() jetstream.JetStream {
	c.t.Helper()
	var urls []string
	for _, p := range c.clients {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", p))
	}
	var nc *nats.Conn
	require.Eventually(c.t, func() bool {
		var err error
		nc, err = nats.Connect(strings.Join(urls, ","))
		return err == nil
	}, 30*time.Second, 100*time.Millisecond, "connect to the NATS servers")
	c.t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(c.t, err)
	return js
}

// lazyFSForTest skips unless TELEMETRY_LAZYFS names the lazyfs binary
// and this is root (FUSE mounts), and returns the binary and a logger
// of warnings.
func lazyFSForTest(t *testing.T) (string, *slog.Logger) {
	t.Helper()
	bin := os.Getenv("TELEMETRY_LAZYFS")
	if bin == "" {
		t.Skip("set TELEMETRY_LAZYFS to the lazyfs binary (cmd/telemetry-crashloop/README.md)")
	}
	if os.Geteuid() != 0 {
		t.Skip("LazyFS mounts need root here")
	}
	return bin, slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
