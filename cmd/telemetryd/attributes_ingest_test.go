package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// deviceAttributes reads device's attributes from GET
// /v1/devices/{device} (nil for a device the service does not know or
// one without attributes).
func deviceAttributes(t *testing.T, s *testService, device string) map[string]string {
	t.Helper()
	var d struct {
		Attributes map[string]string `json:"attributes"`
	}
	code, body := s.get(t, "/v1/devices/"+device, &d)
	if code == http.StatusNotFound {
		return nil
	}
	require.Equal(t, http.StatusOK, code, body)
	if len(d.Attributes) == 0 {
		return nil
	}
	return d.Attributes
}

// waitAttributes waits until device has exactly want.
func waitAttributes(t *testing.T, s *testService, device string, want map[string]string) {
	t.Helper()
	waitFor(t, 20*time.Millisecond, func() bool { return assert.ObjectsAreEqual(want, deviceAttributes(t, s, device)) },
		"device %s: want attributes %v", device, want)
}

// JSON over NATS and MQTT sets attributes as of the reading's time: a
// later message with an older time does not roll one back, and the same
// messages delivered again change nothing.
func TestJSONAttributes(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	t1, t2 := testEpoch.Add(-2*time.Minute), testEpoch.Add(-time.Minute)
	msg := func(at time.Time, v int, attrs string) string {
		return fmt.Sprintf(`{"ts":%q,"v":%d,"attributes":%s}`, at.Format(time.RFC3339Nano), v, attrs)
	}
	newer := msg(t2, 2, `{"fleet":"West","model":"F-150"}`)
	older := msg(t1, 1, `{"fleet":"East","site":"depot-3"}`)
	s.publish(t, "truck-1", newer)
	s.publish(t, "truck-1", older) // late: fleet stays West, site is new
	waitStored(t, s, "truck-1", 2)
	want := map[string]string{"fleet": "West", "model": "F-150", "site": "depot-3"}
	waitAttributes(t, s, "truck-1", want)

	// A batch: each element's attributes hold as of its own time.
	s.publish(t, "truck-2", fmt.Sprintf(`[%s,%s]`, msg(t2, 2, `{"fleet":"North"}`), msg(t1, 1, `{"fleet":"South"}`)))
	waitStored(t, s, "truck-2", 2)
	waitAttributes(t, s, "truck-2", map[string]string{"fleet": "North"})

	// MQTT (paho, QoS 1): the same JSON.
	c := newMQTTClient(t, s, "attrs")
	tok := c.Publish("telemetry/truck-3", 1, false, msg(t1, 1, `{"fleet":"East"}`))
	require.True(t, tok.WaitTimeout(10*time.Second))
	require.NoError(t, tok.Error())
	waitStored(t, s, "truck-3", 1)
	waitAttributes(t, s, "truck-3", map[string]string{"fleet": "East"})

	// Delivered again, in either order, nothing changes.
	s.publish(t, "truck-1", newer)
	s.publish(t, "truck-1", older)
	last := msg(t2.Add(time.Second), 3, `{"model":"F-250"}`)
	s.publish(t, "truck-1", last)
	waitStored(t, s, "truck-1", 3)
	want["model"] = "F-250"
	waitAttributes(t, s, "truck-1", want)
	s.publish(t, "truck-1", older)
	s.publish(t, "truck-1", newer)
	s.publish(t, "truck-1", msg(t2.Add(2*time.Second), 4, `{}`)) // a marker: once stored, the two before it are applied
	waitStored(t, s, "truck-1", 4)
	assert.Equal(t, want, deviceAttributes(t, s, "truck-1"))
}

// A message with an invalid attribute is dead-lettered whole with the
// attribute's code, over NATS and MQTT alike.
func TestJSONInvalidAttributesAreDeadLettered(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	sub := deadLetters(t, s)
	ts := testEpoch.Add(-time.Minute).Format(time.RFC3339Nano)
	bad := fmt.Sprintf(`{"ts":%q,"v":1,"attributes":{"fleet":"East","rack-id":"r1"}}`, ts)
	s.publish(t, "bad-1", bad)
	dl, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "rejected.telemetry.bad-1", dl.Subject)
	assert.Equal(t, bad, string(dl.Data))
	assert.Equal(t, string(buckets.CodeInvalidAttributeName), dl.Header.Get("Telemetry-Error-Code"))
	assert.Contains(t, dl.Header.Get("Telemetry-Error"), "reading 0: attributes.rack-id: attribute name must match")

	c := newMQTTClient(t, s, "attrs-bad")
	bad = fmt.Sprintf(`{"ts":%q,"v":1,"attributes":{"fleet":3}}`, ts)
	require.True(t, c.Publish("telemetry/bad-2", 1, false, bad).WaitTimeout(10*time.Second))
	dl, err = sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "rejected.telemetry.bad-2", dl.Subject)
	assert.Equal(t, string(buckets.CodeInvalidAttributeValue), dl.Header.Get("Telemetry-Error-Code"))

	s.publish(t, "bad-1", fmt.Sprintf(`{"ts":%q,"v":2}`, ts))
	waitStored(t, s, "bad-1", 1)
	assert.Nil(t, deviceAttributes(t, s, "bad-1"), "nothing of the rejected message was applied")
	assert.Nil(t, deviceAttributes(t, s, "bad-2"))
}

// A message that would leave its device with more than 64 attributes is
// refused by the store and dead-lettered whole: none of its readings is
// written.
func TestAttributesPastTheLimitAreDeadLettered(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	sub := deadLetters(t, s)
	ts := func(i int) string { return testEpoch.Add(time.Duration(i-10) * time.Second).Format(time.RFC3339Nano) }
	obj := func(prefix string, n int) string {
		var parts []string
		for i := range n {
			parts = append(parts, fmt.Sprintf(`"%s%02d":"x"`, prefix, i))
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	s.publish(t, "full", fmt.Sprintf(`{"ts":%q,"v":1,"attributes":%s}`, ts(1), obj("a", 60)))
	waitStored(t, s, "full", 1)
	over := fmt.Sprintf(`{"ts":%q,"v":2,"attributes":%s}`, ts(2), obj("b", 5))
	s.publish(t, "full", over)
	dl, err := sub.NextMsg(10 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "rejected.telemetry.full", dl.Subject)
	assert.Equal(t, over, string(dl.Data))
	assert.Equal(t, string(buckets.CodeTooManyAttributes), dl.Header.Get("Telemetry-Error-Code"))
	assert.Contains(t, dl.Header.Get("Telemetry-Error"), "65 attributes")

	s.publish(t, "full", fmt.Sprintf(`{"ts":%q,"v":3,"attributes":%s}`, ts(3), obj("a", 4)))
	waitStored(t, s, "full", 2)
	rs := pageAll(t, s, "full", "asc", 10, url.Values{})
	assert.Equal(t, []any{1.0, 3.0}, []any{rs[0].Values["v"], rs[1].Values["v"]}, "the refused message's reading is not stored")
	assert.Len(t, deviceAttributes(t, s, "full"), 60)
}

// Line protocol through /api/v2/write with the InfluxDB client: tags
// other than the device tag are attributes as of the line's time, not
// values; a tag that cannot be an attribute rejects its line, naming
// the tag.
func TestLineProtocolTagsAreAttributes(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute)
	client := influxdb2.NewClientWithOptions(s.base, "any-token", influxdb2.DefaultOptions().SetPrecision(time.Millisecond))
	defer client.Close()
	w := client.WriteAPIBlocking("fleet", "readings")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, w.WritePoint(ctx,
		influxdb2.NewPoint("truck", map[string]string{"device": "lp-truck", "fleet": "East", "model": "F-150", "host": "gw-1"},
			map[string]any{"fuel": 0.5}, at),
		influxdb2.NewPoint("truck", map[string]string{"device": "lp-truck", "fleet": "West"},
			map[string]any{"fuel": 0.4}, at.Add(time.Second)),
		influxdb2.NewPoint("truck", map[string]string{"device": "lp-truck", "fleet": "North"}, // late
			map[string]any{"fuel": 0.6}, at.Add(-time.Second)),
	))
	waitStored(t, s, "lp-truck", 3)
	code, v := s.point(t, "lp-truck", at)
	require.Equal(t, http.StatusOK, code)
	assert.Equal(t, map[string]any{"truck_fuel": 0.5}, v, "tags are not values")
	waitAttributes(t, s, "lp-truck", map[string]string{"fleet": "West", "model": "F-150", "host": "gw-1"})

	// A second request with an older line does not roll fleet back.
	require.NoError(t, w.WriteRecord(ctx, fmt.Sprintf("truck,device=lp-truck,fleet=South fuel=0.7 %d", at.Add(-time.Minute).UnixMilli()),
		fmt.Sprintf("truck,device=lp-truck fuel=0.8 %d", at.Add(time.Minute).UnixMilli())))
	waitStored(t, s, "lp-truck", 5)
	assert.Equal(t, map[string]string{"fleet": "West", "model": "F-150", "host": "gw-1"}, deviceAttributes(t, s, "lp-truck"))

	err := w.WriteRecord(ctx, fmt.Sprintf("truck,device=lp-bad,k8s.pod=p1 fuel=1 %d", at.UnixMilli()),
		fmt.Sprintf("truck,device=lp-good,pod=p1 fuel=1 %d", at.UnixMilli()))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "partial write: 1 of 2 lines rejected; line 1: tag k8s.pod: attribute name must match [A-Za-z_][A-Za-z0-9_]* (tags are attributes of the device) (invalid_attribute_name)")
	waitStored(t, s, "lp-good", 1)
	waitAttributes(t, s, "lp-good", map[string]string{"pod": "p1"})
	assert.Empty(t, pageAll(t, s, "lp-bad", "asc", 10, url.Values{}), "the rejected line stores nothing")
}

// -line-tags values keeps the earlier mapping: tags are string values
// <measurement>_<tag>, and no attribute is set.
func TestLineTagsValues(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.LineTags = "values"
	s := startService(t, cfg)
	at := testEpoch.Add(-time.Minute)
	code, resp := s.post(t, "/api/v2/write?precision=ms",
		[]byte(fmt.Sprintf("truck,device=lp-v,fleet=East,rack-id=r1 fuel=0.5 %d\n", at.UnixMilli())), nil)
	require.Equal(t, http.StatusNoContent, code, resp)
	waitStored(t, s, "lp-v", 1)
	_, v := s.point(t, "lp-v", at)
	assert.Equal(t, map[string]any{"truck_fuel": 0.5, "truck_fleet": "East", "truck_rack-id": "r1"}, v)
	assert.Nil(t, deviceAttributes(t, s, "lp-v"))
}

// Replaying the whole stream delivers every message again, the late
// one after the newer one as before: no attribute is rolled back and no
// reading added. The replay: the store's saved positions are removed,
// so on start the consumer, which acked past the store, is created
// again from the beginning of the stream.
func TestAttributesSurviveReplay(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	at := func(i int) string { return testEpoch.Add(time.Duration(i-10) * time.Second).Format(time.RFC3339Nano) }
	s.publish(t, "replayed", fmt.Sprintf(`{"ts":%q,"v":2,"attributes":{"fleet":"West"}}`, at(2)))
	s.publish(t, "replayed", fmt.Sprintf(`{"ts":%q,"v":1,"attributes":{"fleet":"East","site":"depot-3"}}`, at(1))) // late
	s.publish(t, "replayed", fmt.Sprintf(`{"ts":%q,"v":3,"attributes":{"model":"F-150"}}`, at(3)))
	waitStored(t, s, "replayed", 3)
	want := map[string]string{"fleet": "West", "site": "depot-3", "model": "F-150"}
	waitAttributes(t, s, "replayed", want)
	s.stop(t)

	require.NoError(t, os.Remove(filepath.Join(cfg.DataDir, "POSITIONS")))
	restarted := time.Now()
	s = startService(t, cfg)
	ctx, cancel := untilDeadline(t)
	defer cancel()
	var info *jetstream.ConsumerInfo
	waitFor(t, 20*time.Millisecond, func() bool {
		c, err := s.js.Consumer(ctx, streamOf("replayed"), "ingest")
		if err != nil {
			return false
		}
		info, err = c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0 && info.AckFloor.Stream >= 3
	}, "consumer not recreated or not drained")
	require.True(t, info.Created.After(restarted), "the consumer was created again (at %s, the restart began at %s)", info.Created, restarted)
	require.Equal(t, jetstream.DeliverAllPolicy, info.Config.DeliverPolicy, "the stream was replayed from its start")
	require.Equal(t, uint64(3), info.Delivered.Stream)
	assert.Equal(t, want, deviceAttributes(t, s, "replayed"))
	assert.Len(t, pageAll(t, s, "replayed", "asc", 10, url.Values{}), 3)
}

// TestClusterIngestAttributes: three nodes, every partition on two of
// them. Attributes sent with readings (JSON over NATS, line protocol
// through one node) are applied by the ingesters of both owners (their
// own stores hold them), and every node answers them.
func TestClusterIngestAttributes(t *testing.T) {
	inLane(t, lanes.cluster)
	nc := startNATSCluster(t, 1)
	nodes := startConvergedNodes(t, nc, 3, 2, func(*Config) {})
	js := jsFor(t, nc.url(0))
	const n = 6
	at := testEpoch.Add(-time.Minute)
	var acks []jetstream.PubAckFuture
	var lines strings.Builder
	for i := range n {
		a, err := js.PublishAsync(fmt.Sprintf("telemetry.json_%d", i),
			fmt.Appendf(nil, `{"ts":%d,"load":%d,"attributes":{"fleet":"F%d"}}`, at.UnixMilli(), i, i%2))
		require.NoError(t, err)
		acks = append(acks, a)
		fmt.Fprintf(&lines, "truck,device=lp_%d,fleet=F%d load=%d %d\n", i, i%2, i, at.UnixMilli())
	}
	awaitAcks(t, acks)
	code, body := sendJSON(t, http.MethodPost, nodes[0].base+"/api/v2/write?precision=ms", lines.String())
	require.Equal(t, http.StatusNoContent, code, body)

	for i := range n {
		for _, dev := range []string{fmt.Sprintf("json_%d", i), fmt.Sprintf("lp_%d", i)} {
			want := map[string]string{"fleet": fmt.Sprintf("F%d", i%2)}
			waitFor(t, 50*time.Millisecond, func() bool {
				owners := 0
				for _, node := range nodes {
					d, err := node.main().store.Device(context.Background(), buckets.DeviceID(dev))
					if err == nil && assert.ObjectsAreEqual(buckets.Attributes{{Name: "fleet", Value: want["fleet"]}}, d.Attributes) {
						owners++
					}
				}
				return owners == 2
			}, "device %s: both owners' stores hold its attributes", dev)
			for k, node := range nodes {
				waitFor(t, 50*time.Millisecond, func() bool {
					var d struct {
						Attributes map[string]string `json:"attributes"`
					}
					resp, err := http.Get(node.base + "/v1/devices/" + dev)
					if err != nil {
						return false
					}
					defer resp.Body.Close()
					return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&d) == nil &&
						assert.ObjectsAreEqual(want, d.Attributes)
				}, "node %d: device %s has attributes %v", k, dev, want)
			}
		}
	}
}
