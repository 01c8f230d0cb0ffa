package ingest

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestAckWindow(t *testing.T) {
	assert.Equal(t, minAckPending, ackWindow(0, 10000), "idle: the floor")
	assert.Equal(t, minAckPending, ackWindow(100, 10000), "two seconds of commits, at least the floor")
	assert.Equal(t, 10000, ackWindow(1e6, 10000), "never above the configured maximum")
	assert.Equal(t, 10, ackWindow(0, 10), "a maximum below the floor wins")
	assert.Equal(t, 600, ackWindow(300, 10000))
}

func TestRepace(t *testing.T) {
	for _, tc := range []struct {
		name             string
		cur, want, limit int
		replicated       bool
		change           bool
	}{
		{"same", 1000, 1000, 10000, false, false},
		{"up by a quarter", 1000, 1250, 10000, false, true},
		{"up by less", 1000, 1249, 10000, false, false},
		{"down by a quarter", 1000, 750, 10000, false, true},
		{"down by less", 1000, 751, 10000, false, false},
		{"back to the limit by little", 9900, 10000, 10000, false, true},
		{"replicated: up", 1000, 1250, 10000, true, true},
		{"replicated: never down", 1000, 256, 10000, true, false},
		{"replicated: never down from the limit", 10000, 256, 10000, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.change, repace(tc.cur, tc.want, tc.limit, tc.replicated))
		})
	}
}

// When commits fall behind, the consumer's window of delivered,
// unacked messages shrinks to what commits keep up with; when they
// speed up it grows back to the configured maximum.
func TestIngestPacesTheConsumerToTheCommitRate(t *testing.T) {
	var slow atomic.Bool
	slow.Store(true)
	e := newTestEnv(t, func(c *Config) {
		c.PaceEvery = 100 * time.Millisecond
		c.MaxBatchReadings = 10
		c.MaxBatchWait = time.Millisecond
		c.AckWait = 30 * time.Second
	})
	e.w.setFail(func([]buckets.Reading) error {
		if slow.Load() {
			time.Sleep(50 * time.Millisecond) // 200 messages/s at 10 a batch
		}
		return nil
	})
	e.start()
	// In rounds of 1,000: past 4,000 acks outstanding the client stalls
	// and refuses the next publish after 200 ms, which a loaded machine
	// reached.
	publishN := func(n int) {
		for i := range n {
			_, err := e.js.PublishAsync("telemetry.dev-1", []byte(flat(nowMillis()+int64(i), i)))
			require.NoError(t, err)
			if (i+1)%1000 != 0 && i+1 != n {
				continue
			}
			select {
			case <-e.js.PublishAsyncComplete():
			case <-time.After(time.Minute):
				t.Fatal("publish did not complete")
			}
		}
	}
	publishN(5000)
	var info = e.consumerInfo()
	require.Eventually(t, func() bool {
		info = e.consumerInfo()
		return info.Config.MaxAckPending <= 1000
	}, 10*time.Second, 20*time.Millisecond, "window not paced down: %d", info.Config.MaxAckPending)
	time.Sleep(300 * time.Millisecond)
	info = e.consumerInfo()
	assert.LessOrEqual(t, info.NumAckPending, 1000, "delivered and unacked messages follow the window")
	assert.Greater(t, info.NumPending, uint64(1000), "the backlog waits in the stream")
	assert.Less(t, e.in.window.Load(), int64(1001))

	slow.Store(false)
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; !stop.Load(); i++ {
			if _, err := e.js.PublishAsync("telemetry.dev-2", []byte(flat(nowMillis()+int64(i), i))); err != nil {
				return
			}
			if i%1000 == 999 {
				<-e.js.PublishAsyncComplete()
			}
		}
	}()
	defer func() { stop.Store(true); <-done }()
	require.Eventually(t, func() bool {
		return e.consumerInfo().Config.MaxAckPending == 10000
	}, 30*time.Second, 50*time.Millisecond, "window did not grow back")
}
