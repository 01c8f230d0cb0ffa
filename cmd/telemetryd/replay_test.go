package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// sentMsg is one published message of the replay test.
type sentMsg struct {
	device     string
	day        buckets.Day
	ts         []string // RFC 3339 of its readings
	sent, aked time.Time
}

// The ingest consumer is deleted while readings flow, a day is dropped
// while it is gone, and the service creates the consumer again by
// itself: it starts after the saved stream position (not at the
// beginning of the stream), no reading of the dropped day published
// before the drop comes back, every other reading is stored, and none
// is stored twice.
func TestReplayAfterConsumerLossDoesNotResurrectADroppedDay(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.StreamPartitions = 1 // every device's messages in TELEMETRY_0
	s := startService(t, cfg)
	today := buckets.DayOfTime(testEpoch)
	yesterday := today - 1
	devices := []string{"dev-a", "dev-b", "dev-c", "dev-d"}
	const perMsg = 10

	var mu sync.Mutex
	var sent []sentMsg
	stop := make(chan struct{})
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			m := sentMsg{device: devices[i%len(devices)], day: today}
			if (i/len(devices))%2 == 1 {
				m.day = yesterday
			}
			base := m.day.Start().Time().Add(time.Hour + time.Duration(i)*time.Second)
			var parts []string
			for j := range perMsg {
				ts := base.Add(time.Duration(j) * time.Millisecond).Format(time.RFC3339Nano)
				m.ts = append(m.ts, ts)
				parts = append(parts, fmt.Sprintf(`{"ts":%q,"v":%d}`, ts, i*perMsg+j))
			}
			m.sent = time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := s.js.Publish(ctx, "telemetry."+m.device, []byte("["+strings.Join(parts, ",")+"]"))
			cancel()
			if err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
			m.aked = time.Now()
			mu.Lock()
			sent = append(sent, m)
			mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	count := func() int { mu.Lock(); defer mu.Unlock(); return len(sent) }
	waitFor(t, 10*time.Millisecond, func() bool { return count() > 300 })
	time.Sleep(1500 * time.Millisecond) // let a stream position be saved

	ctx := context.Background()
	require.NoError(t, s.js.DeleteConsumer(ctx, "TELEMETRY_0", "ingest"))
	dropStart := time.Now()
	req, err := http.NewRequest(http.MethodDelete, s.base+"/v1/tables/"+yesterday.String(), nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	dropEnd := time.Now()

	n := count()
	waitFor(t, 10*time.Millisecond, func() bool { return count() > n+300 })
	close(stop)
	<-pubDone

	// The consumer was created again, after the saved position.
	var info *jetstream.ConsumerInfo
	waitFor(t, 50*time.Millisecond, func() bool {
		c, err := s.js.Consumer(ctx, "TELEMETRY_0", "ingest")
		if err != nil {
			return false
		}
		info, err = c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, "consumer not recreated or not drained")
	assert.Equal(t, jetstream.DeliverByStartSequencePolicy, info.Config.DeliverPolicy)
	assert.Greater(t, info.Config.OptStartSeq, uint64(100), "a recreated consumer must not replay the stream from its beginning")

	want := map[string]map[string]bool{} // device -> ts that must be stored
	gone := map[string]map[string]bool{} // device -> ts that must not be
	for _, m := range sent {
		for _, ts := range m.ts {
			switch {
			case m.day == today || m.sent.After(dropEnd):
				if want[m.device] == nil {
					want[m.device] = map[string]bool{}
				}
				want[m.device][ts] = true
			case m.aked.Before(dropStart):
				if gone[m.device] == nil {
					gone[m.device] = map[string]bool{}
				}
				gone[m.device][ts] = true
			}
		}
	}
	from := yesterday.Start().Time().Format(time.RFC3339Nano)
	to := (today + 1).Start().Time().Format(time.RFC3339Nano)
	for _, d := range devices {
		require.NotEmpty(t, gone[d], "the test needs readings of the dropped day from before the drop")
		var got []apiReading
		waitFor(t, 100*time.Millisecond, func() bool {
			got = pageAll(t, s, d, "asc", 10000, url.Values{"from": {from}, "to": {to}})
			return len(got) >= len(want[d])
		}, "device %s: want at least %d readings", d, len(want[d]))
		seen := map[string]bool{}
		missing := len(want[d])
		for _, r := range got {
			assert.False(t, seen[r.TS], "device %s: reading %s stored twice", d, r.TS)
			seen[r.TS] = true
			assert.False(t, gone[d][r.TS], "device %s: reading %s of the dropped day came back", d, r.TS)
			if want[d][r.TS] {
				missing--
			}
		}
		assert.Zero(t, missing, "device %s: readings lost", d)
	}
}
