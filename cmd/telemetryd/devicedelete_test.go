package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// attrMsg is a JSON reading of value v at at with attributes attrs (a
// JSON object).
func attrMsg(at time.Time, v int, attrs string) string {
	return fmt.Sprintf(`{"ts":%q,"v":%d,"attributes":%s}`, at.Format(time.RFC3339Nano), v, attrs)
}

// answersOf GETs each path from base and returns status and body of
// each, for a byte-for-byte comparison.
func answersOf(t *testing.T, base string, paths []string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range paths {
		code, body := getBody(t, base+p)
		out[p] = fmt.Sprintf("%d %s", code, body)
	}
	return out
}

// keptPaths are the answers about device dev that a delete of another
// device must leave byte-for-byte the same.
func keptPaths(dev string) []string {
	from := url.QueryEscape(testEpoch.AddDate(0, 0, -3).Format(time.RFC3339))
	to := url.QueryEscape(testEpoch.Add(time.Hour).Format(time.RFC3339))
	return []string{
		"/v1/devices/" + dev + "/readings?order=asc&limit=1000&from=" + from + "&to=" + to,
		"/v1/devices/" + dev + "/readings/latest?limit=5",
		"/v1/devices/" + dev,
		"/v1/devices/" + dev + "/aggregates?interval=1h&fn=count,sum,min,max&from=" + from + "&to=" + to,
	}
}

// deviceAttrs returns dev's attributes from GET /v1/devices/{dev}, or
// nil with the status when it is not 200.
func deviceAttrs(t *testing.T, base, dev string) (int, map[string]string) {
	t.Helper()
	code, body := getBody(t, base+"/v1/devices/"+dev)
	if code != http.StatusOK {
		return code, nil
	}
	var d struct {
		Attributes map[string]string `json:"attributes"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &d), body)
	return code, d.Attributes
}

// replayFromStart replaces the service's durable consumer of every
// readings stream with one that delivers the whole stream again, as a
// consumer lost with the server's state and created anew would, and
// waits until the service settled every message. The streams replay
// at once, each on its own consumer, as after a restart of the server.
func replayFromStart(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	streams := readingStreams(t, js)
	last := make([]uint64, len(streams))
	for i, name := range streams {
		last[i] = replaceForReplay(t, js, name)
	}
	for i, name := range streams {
		waitReplayed(t, js, name, last[i])
	}
}

// replaceForReplay replaces the service's consumer of stream with one
// that delivers it from its start, and returns the stream's last
// sequence then.
func replaceForReplay(t *testing.T, js jetstream.JetStream, stream string) uint64 {
	t.Helper()
	ctx := context.Background()
	c, err := js.Consumer(ctx, stream, "ingest")
	require.NoError(t, err)
	cc := c.CachedInfo().Config
	cc.DeliverPolicy, cc.OptStartSeq, cc.OptStartTime = jetstream.DeliverAllPolicy, 0, nil
	// The service may create its own between the delete and the create:
	// then go again.
	waitFor(t, 20*time.Millisecond, func() bool {
		_ = js.DeleteConsumer(ctx, stream, "ingest")
		_, err := js.CreateConsumer(ctx, stream, cc)
		return err == nil
	}, "consumer not replaced")
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	return st.CachedInfo().State.LastSeq
}

// waitReplayed waits until the service's consumer of stream, replaced
// by replaceForReplay, acked every message up to last.
func waitReplayed(t *testing.T, js jetstream.JetStream, stream string, last uint64) {
	t.Helper()
	ctx := context.Background()
	waitFor(t, 20*time.Millisecond, func() bool {
		c, err := js.Consumer(ctx, stream, "ingest")
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.Config.DeliverPolicy == jetstream.DeliverAllPolicy &&
			info.AckFloor.Stream >= last && info.NumAckPending == 0 && info.NumPending == 0
	}, "the replay from the start of stream %s did not settle", stream)
}

// readingStreams names the readings streams there are: TELEMETRY, or
// the partitions' TELEMETRY_0, TELEMETRY_1, ...
func readingStreams(t testing.TB, js jetstream.JetStream) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []string
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if rest, ok := strings.CutPrefix(name, "TELEMETRY_"); name == "TELEMETRY" || ok && rest != "" && strings.Trim(rest, "0123456789") == "" {
			out = append(out, name)
		}
	}
	require.NoError(t, names.Err())
	require.NotEmpty(t, out, "no readings stream")
	return out
}

// TestDeleteDeviceEndToEnd deletes a device through the HTTP API while
// another one keeps its data: the deleted device's readings, latest
// values, record and attributes are gone; a replay of the whole stream
// by a consumer created anew, before and after a restart, brings none
// of it back; what the device publishes after the delete is stored; and
// every answer about the other device is byte-for-byte the same.
func TestDeleteDeviceEndToEnd(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	today := testEpoch.Truncate(24 * time.Hour)
	for i := range 20 {
		at := today.Add(-12*time.Hour + time.Duration(i)*time.Hour) // yesterday and today
		s.publish(t, "gone", attrMsg(at, i, `{"fleet":"East","model":"M-1"}`))
		s.publish(t, "kept", attrMsg(at, 100+i, `{"fleet":"East"}`))
	}
	waitStored(t, s, "gone", 20)
	waitStored(t, s, "kept", 20)
	waitFor(t, 20*time.Millisecond, func() bool {
		_, a := deviceAttrs(t, s.base, "gone")
		return a["model"] == "M-1"
	}, "attributes of gone")
	before := answersOf(t, s.base, keptPaths("kept"))

	code, body := s.do(t, http.MethodDelete, "/v1/devices/gone")
	require.Equal(t, http.StatusOK, code, body)
	var res struct {
		Device   string    `json:"device"`
		Deleted  time.Time `json:"deleted"`
		Readings int64     `json:"readings"`
		Tables   int       `json:"tables"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &res), body)
	assert.Equal(t, "gone", res.Device)
	assert.Equal(t, int64(20), res.Readings)
	assert.Equal(t, 2, res.Tables)

	code, body = s.do(t, http.MethodDelete, "/v1/devices/gone")
	assert.Equal(t, http.StatusNotFound, code, "deleted already: %s", body)
	assert.Contains(t, body, `device: \"gone\" is not known`)
	code, body = s.do(t, http.MethodDelete, "/v1/devices/-gone")
	assert.Equal(t, http.StatusBadRequest, code, body)
	assert.Contains(t, body, "must start with a letter or digit")

	checkGone := func(step string, wantReadings int, wantAttrs map[string]string) {
		t.Helper()
		rs := pageAll(t, s, "gone", "asc", 1000, url.Values{})
		assert.Len(t, rs, wantReadings, "%s: readings of the deleted device", step)
		var latest apiList
		code, _ := s.get(t, "/v1/devices/gone/readings/latest?limit=100", &latest)
		assert.Equal(t, http.StatusOK, code)
		assert.Len(t, latest.Readings, wantReadings, "%s: latest", step)
		code, attrs := deviceAttrs(t, s.base, "gone")
		if wantReadings == 0 {
			assert.Equal(t, http.StatusNotFound, code, "%s: the device record", step)
		}
		assert.Equal(t, wantAttrs, attrs, "%s: attributes", step)
		_, body := getBody(t, s.base+"/v1/devices?match="+url.QueryEscape(`{fleet="East"}`))
		assert.NotContains(t, body, `"gone"`, "%s: listed by its old attributes", step)
		assert.Contains(t, body, `"kept"`, step)
		_, body = getBody(t, s.base+"/api/v1/label/model/values")
		assert.NotContains(t, body, "M-1", "%s: its attribute values", step)
		assert.Equal(t, before, answersOf(t, s.base, keptPaths("kept")), "%s: the other device's answers", step)
	}
	checkGone("after the delete", 0, nil)

	// Published after the delete: stored, on both days again.
	s.publish(t, "gone", attrMsg(today.Add(-12*time.Hour+30*time.Minute), 1000, `{"fleet":"West"}`))
	s.publish(t, "gone", attrMsg(today.Add(7*time.Hour+30*time.Minute), 1001, `{"fleet":"West"}`))
	waitStored(t, s, "gone", 2)
	checkGone("after new readings", 2, map[string]string{"fleet": "West"})

	replayFromStart(t, s.js)
	checkGone("after a replay of the whole stream", 2, map[string]string{"fleet": "West"})

	s.stop(t)
	s = startService(t, cfg)
	checkGone("after a restart", 2, map[string]string{"fleet": "West"})
	replayFromStart(t, s.js)
	checkGone("after a restart and a replay of the whole stream", 2, map[string]string{"fleet": "West"})
}
