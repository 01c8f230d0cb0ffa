package natsembed

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

// failingPublisher counts publishes and fails each one.
type failingPublisher struct{ n atomic.Int64 }

func (p *failingPublisher) PublishMsg(*nats.Msg) error {
	p.n.Add(1)
	return nats.ErrConnectionClosed
}

// TestQoS0ForwarderSamplesItsFailures: while the service's connection
// fails every publish, each QoS 0 reading is tried, and the log gets the
// sampler's burst of lines, not one line per reading; QoS 1 publishes
// (stored by the server) are not forwarded at all.
func TestQoS0ForwarderSamplesItsFailures(t *testing.T) {
	var logs lockedBuffer
	out := &failingPublisher{}
	f := newQoS0Forwarder(out, slog.New(slog.NewTextHandler(&logs, nil)))
	for i := range 200 {
		qos := "0"
		if i%2 == 1 {
			qos = "1"
		}
		f.forward(&nats.Msg{Subject: "telemetry.dev-1", Header: nats.Header{MQTTQoSHeader: []string{qos}}, Data: []byte(`{}`)})
	}
	assert.Equal(t, int64(100), out.n.Load(), "every QoS 0 reading, and no QoS 1 one, was forwarded")
	lines := strings.Count(logs.String(), "QoS 0 MQTT reading dropped: not forwarded")
	assert.Equal(t, f.sampler.Burst, lines, logs.String())
	assert.Contains(t, logs.String(), nats.ErrConnectionClosed.Error())
}

// TestQoS0ForwarderReportsSlowConsumer: when the forwarder's
// subscription overflows, the server drops readings and the log says
// so, with how many.
func TestQoS0ForwarderReportsSlowConsumer(t *testing.T) {
	srv := ingesttest.RunNATS(t)
	var logs lockedBuffer
	f := newQoS0Forwarder(&failingPublisher{}, slog.New(slog.NewTextHandler(&logs, nil)))
	nc, err := nats.Connect(srv.ClientURL(), nats.ErrorHandler(f.asyncError))
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	sub, err := nc.Subscribe("telemetry.*", func(*nats.Msg) { <-release })
	require.NoError(t, err)
	require.NoError(t, sub.SetPendingLimits(2, -1))
	for range 20 {
		require.NoError(t, nc.Publish("telemetry.dev-1", []byte(`{}`)))
	}
	require.NoError(t, nc.Flush())
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "QoS 0 MQTT readings dropped: the forwarder fell behind")
	}, 5*time.Second, 10*time.Millisecond)
	assert.Contains(t, logs.String(), "subject=telemetry.*")
	assert.Regexp(t, `dropped_so_far=[1-9]`, logs.String())
}

// lockedBuffer is a bytes.Buffer safe for a logger and a test to share.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
