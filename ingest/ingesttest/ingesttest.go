// Package ingesttest starts the in-process NATS server with JetStream
// that the tests of the ingester, the service and its tools publish to,
// beside ingest the way net/http/httptest sits beside net/http.
package ingesttest

import (
	"context"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// RunNATS starts a NATS server with JetStream on 127.0.0.1, a random
// port and a store under t.TempDir(), without logs or signal handlers,
// after edit (if any) adjusts its options (a fixed port, a store to
// reuse, an MQTT listener). It is shut down when the test ends;
// shutting it down earlier is fine.
func RunNATS(t testing.TB, edit ...func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoSigs:    true,
		NoLog:     true,
	}
	for _, e := range edit {
		e(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats server: %v", err)
	}
	srv.Start()
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatalf("nats server on %s:%d did not start", opts.Host, opts.Port)
	}
	return srv
}

// RunNATSCluster starts n RunNATS servers (names s0, s1, ...) routed
// into one JetStream cluster on loopback, and returns them once the
// cluster answers JetStream requests, with a client connection to the
// first (closed when the test ends) and its JetStream context.
func RunNATSCluster(t testing.TB, n int) ([]*server.Server, *nats.Conn, jetstream.JetStream) {
	t.Helper()
	ports := make([]int, n)
	var routes []string
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("route port: %v", err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		routes = append(routes, "nats://127.0.0.1:"+strconv.Itoa(ports[i]))
	}
	var srvs []*server.Server
	for i := range ports {
		srvs = append(srvs, RunNATS(t, func(o *server.Options) {
			o.ServerName = "s" + strconv.Itoa(i)
			o.Cluster = server.ClusterOpts{Name: "ingesttest", Host: "127.0.0.1", Port: ports[i]}
			o.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		}))
	}
	nc, js := connect(t, srvs[0])
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return srvs, nc, js
		}
		if time.Now().After(deadline) {
			t.Fatalf("the JetStream cluster never elected a meta leader: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// JetStream starts RunNATS and returns a client connection to it,
// closed when the test ends, and its JetStream context.
func JetStream(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return connect(t, RunNATS(t))
}

// connect returns a client connection to srv, closed when the test
// ends, and its JetStream context.
func connect(t testing.TB, srv *server.Server) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatalf("connect to %s: %v", srv.ClientURL(), err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream: %v", err)
	}
	return nc, js
}

// RunMQTT starts RunNATS (server name name) with its MQTT listener on a
// free loopback port and a stream TELEMETRY capturing telemetry.*, and
// returns the server, the stream and the MQTT listener's address
// (host:port).
func RunMQTT(t testing.TB, name string) (*server.Server, jetstream.Stream, string) {
	t.Helper()
	var opts *server.Options
	srv := RunNATS(t, func(o *server.Options) {
		o.ServerName = name
		o.MQTT.Host, o.MQTT.Port = "127.0.0.1", -1
		opts = o
	})
	_, js := connect(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TELEMETRY", Subjects: []string{"telemetry.*"}})
	if err != nil {
		t.Fatalf("create stream TELEMETRY: %v", err)
	}
	return srv, st, net.JoinHostPort("127.0.0.1", strconv.Itoa(opts.MQTT.Port))
}

// ProcessCPU is the user and system CPU time of this process so far:
// what a benchmark with the server in-process spends, server included.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
