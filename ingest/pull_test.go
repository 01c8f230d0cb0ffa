package ingest

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// countRequests counts the pull requests sent to the ingester's
// consumer from now on.
func countRequests(t *testing.T, e *testEnv) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	sub, err := e.nc.Subscribe("$JS.API.CONSUMER.MSG.NEXT.TELEMETRY.ingest", func(*nats.Msg) { n.Add(1) })
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	require.NoError(t, e.nc.Flush())
	return &n
}

// A caught-up ingester takes what its stream accumulated every
// PullEvery: messages published one by one while it waits are
// delivered together and committed in a few writes, not one write per
// few messages as they are stored.
func TestPullTakesWhatAccumulated(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.PullEvery = 300 * time.Millisecond
		c.MaxBatchWait = 5 * time.Millisecond
	})
	e.start()
	ms := nowMillis()
	e.waitAcked(e.publish("telemetry.dev-1", flat(ms, 0)))
	before := len(e.w.snapshot())

	const n = 100
	var last uint64
	for i := 1; i <= n; i++ {
		last = e.publish("telemetry.dev-1", flat(ms+int64(i), i))
		time.Sleep(3 * time.Millisecond)
	}
	e.waitAcked(last)
	writes := len(e.w.snapshot()) - before
	assert.LessOrEqual(t, writes, 10, "%d messages published over about %v came in %d writes",
		n, n*3*time.Millisecond, writes)
	assert.Len(t, e.w.stored("dev-1"), n+1)
}

// An idle ingester keeps one request waiting for the stream's next
// message instead of asking every PullEvery.
func TestPullWaitsWhileIdle(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.PullEvery = time.Millisecond })
	e.start()
	e.waitAcked(e.publish("telemetry.dev-1", flat(nowMillis(), 1)))
	time.Sleep(50 * time.Millisecond) // the request after the last message is sent
	requests := countRequests(t, e)
	time.Sleep(500 * time.Millisecond)
	assert.LessOrEqual(t, requests.Load(), int64(2), "requests in 500 ms of idle")

	// The waiting request takes the next message.
	seq := e.publish("telemetry.dev-1", flat(nowMillis(), 2))
	e.waitAcked(seq)
}

// A request that comes back full (here of its bytes) is followed at
// once, however long PullEvery is: a backlog is taken at full speed.
func TestPullFullRequestIsFollowedAtOnce(t *testing.T) {
	e := newTestEnv(t, func(c *Config) {
		c.PullEvery = time.Hour
		c.PullMaxBytes = 1 // raised to twice the server's max payload
	})
	e.setup()
	// Each message about 5 KB; together more than the bytes one request
	// takes (twice the server's max payload, 2 MiB).
	ms := nowMillis()
	var payload strings.Builder
	payload.WriteByte('[')
	for i := range 100 {
		if i > 0 {
			payload.WriteByte(',')
		}
		fmt.Fprintf(&payload, `{"ts":%d,"temp":21.%02d,"hum":%d,"ok":true}`, ms+int64(i), i, 40+i%20)
	}
	payload.WriteByte(']')
	const n = 600
	var last uint64
	for i := range n {
		last = e.publish(fmt.Sprintf("telemetry.dev-%d", i), payload.String())
	}
	requests := countRequests(t, e)
	e.start()
	e.waitAcked(last)
	assert.GreaterOrEqual(t, requests.Load(), int64(2), "the backlog took more than one request")
}

// With a negative PullEvery the server pushes each message as it is
// stored (a pull request kept waiting), as before pulling.
func TestPushedWhenPullEveryIsNegative(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.PullEvery = -1 })
	e.start()
	ms := nowMillis()
	var last uint64
	for i := range 20 {
		last = e.publish(fmt.Sprintf("telemetry.dev-%d", i%3), flat(ms+int64(i), i))
	}
	e.waitAcked(last)
	assert.Len(t, e.w.stored("dev-0"), 7)
	assert.Zero(t, e.consumerInfo().NumAckPending)
}
