package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// attrFleet is what the attribute tests publish and assign: trucks with
// a load each, of fleet East or West and a model, one silent for long.
type attrFleet struct{ n int }

func (f attrFleet) device(i int) string { return fmt.Sprintf("truck_%02d", i) }
func (f attrFleet) fleet(i int) string  { return []string{"East", "West"}[i%2] }
func (f attrFleet) model(i int) string  { return []string{"F-150", "F-250", "R-1"}[i%3] }
func (f attrFleet) load(i int) int      { return 10 + i }

// lastAt is when truck i sent its last reading: truck 0 went silent
// an hour before the others.
func (f attrFleet) lastAt(i int) time.Time {
	if i == 0 {
		return testEpoch.Add(-time.Hour)
	}
	return testEpoch.Add(-time.Minute)
}

// sendJSON sends a PUT or PATCH with a JSON body and returns status and body.
func sendJSON(t *testing.T, method, url, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var b strings.Builder
	_, _ = io.Copy(&b, resp.Body)
	return resp.StatusCode, b.String()
}

// storeOnOwners publishes one reading of each truck, with the JSON
// members extra (",…" or ""), and waits until every truck is stored on
// its two owners among nodes.
func (f attrFleet) storeOnOwners(t *testing.T, js jetstream.JetStream, nodes []*testNode, extra string) {
	t.Helper()
	var acks []jetstream.PubAckFuture
	for i := range f.n {
		a, err := js.PublishAsync("telemetry."+f.device(i), fmt.Appendf(nil, `{"ts":%d,"load":%d%s}`, f.lastAt(i).UnixMilli(), f.load(i), extra))
		require.NoError(t, err)
		acks = append(acks, a)
	}
	awaitAcks(t, acks)
	waitFor(t, 100*time.Millisecond, func() bool {
		total := 0
		for _, n := range nodes {
			total += localDevices(t, n.main())
		}
		return total == 2*f.n
	}, "every truck stored on its two owners")
}

// TestClusterAttributes: three nodes, every partition on two of them.
// Attributes are set through any node (each write reaches every owner
// of the device's partition), and attribute filters, label values and
// PromQL over attribute labels answer the same through every node.
func TestClusterAttributes(t *testing.T) {
	inLane(t, lanes.cluster)
	f := attrFleet{n: 24}
	nc := startNATSCluster(t, 1)
	nodes := startConvergedNodes(t, nc, 3, 2, func(*Config) {})
	js := jsFor(t, nc.url(0))
	f.storeOnOwners(t, js, nodes, "")

	// Set each truck's attributes through a different node: a PUT, then
	// a PATCH that adds the model.
	for i := range f.n {
		base := nodes[i%3].base
		code, body := sendJSON(t, http.MethodPut, base+"/v1/devices/"+f.device(i)+"/attributes", `{"fleet":"`+f.fleet(i)+`","tmp":"x"}`)
		require.Equal(t, http.StatusOK, code, body)
		code, body = sendJSON(t, http.MethodPatch, nodes[(i+1)%3].base+"/v1/devices/"+f.device(i)+"/attributes",
			`{"model":"`+f.model(i)+`","tmp":null}`)
		require.Equal(t, http.StatusOK, code, body)
		assert.JSONEq(t, `{"device":"`+f.device(i)+`","attributes":{"fleet":"`+f.fleet(i)+`","model":"`+f.model(i)+`"}}`, body)
	}
	// Both owners of every truck hold its attributes.
	for _, n := range nodes {
		m := n.main()
		for i := range f.n {
			if d, err := m.store.Device(t.Context(), buckets.DeviceID(f.device(i))); err == nil && d.LastSeen != 0 {
				assert.Equal(t, map[string]string{"fleet": f.fleet(i), "model": f.model(i)}, d.Attributes.Map(),
					"%s on %s", f.device(i), n.cfg.Cluster.NodeName)
			}
		}
	}

	var wantMatch []string
	sums := map[string][2]int{}
	for i := range f.n {
		if f.fleet(i) == "East" && strings.HasPrefix(f.model(i), "F-") {
			wantMatch = append(wantMatch, f.device(i))
		}
		if i != 0 { // truck 0 is past the lookback at the query time
			s := sums[f.fleet(i)]
			sums[f.fleet(i)] = [2]int{s[0] + f.load(i), s[1] + 1}
		}
	}
	at := strconv.FormatInt(testEpoch.Unix(), 10)
	for _, n := range nodes {
		name := n.cfg.Cluster.NodeName
		// Attribute filter, paged across nodes.
		var got []string
		for _, page := range walk(t, []string{n.base, nodes[0].base}, "/v1/devices?limit=3&match="+url.QueryEscape(`{fleet="East",model=~"F-.*"}`)) {
			var v struct {
				Devices []struct {
					Device     string            `json:"device"`
					Attributes map[string]string `json:"attributes"`
				} `json:"devices"`
			}
			require.NoError(t, json.Unmarshal([]byte(page), &v))
			for _, d := range v.Devices {
				got = append(got, d.Device)
				assert.Equal(t, "East", d.Attributes["fleet"])
			}
		}
		assert.Equal(t, wantMatch, got, "match via %s", name)

		code, body := getBody(t, n.base+"/v1/devices?silent_for=30m")
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"device":"truck_00"`, "via %s", name)
		assert.Equal(t, 1, strings.Count(body, `"device":`), "only truck_00 is silent, via %s: %s", name, body)

		code, body = getBody(t, n.base+"/api/v1/label/fleet/values")
		require.Equal(t, http.StatusOK, code, body)
		assert.JSONEq(t, `{"status":"success","data":["East","West"]}`, body, "via %s", name)
		code, body = getBody(t, n.base+"/api/v1/labels")
		require.Equal(t, http.StatusOK, code, body)
		assert.JSONEq(t, `{"status":"success","data":["__name__","device","fleet","model"]}`, body, "via %s", name)

		code, body = getBody(t, n.base+"/api/v1/query?"+url.Values{"query": {"avg by (fleet) (load)"}, "time": {at}}.Encode())
		require.Equal(t, http.StatusOK, code, body)
		var res struct {
			Data struct {
				Result []struct {
					Metric map[string]string `json:"metric"`
					Value  [2]any            `json:"value"`
				} `json:"result"`
			} `json:"data"`
		}
		require.NoError(t, json.Unmarshal([]byte(body), &res))
		gotAvg := map[string]string{}
		for _, r := range res.Data.Result {
			gotAvg[r.Metric["fleet"]] = r.Value[1].(string)
		}
		wantAvg := map[string]string{}
		for fl, s := range sums {
			wantAvg[fl] = strconv.FormatFloat(float64(s[0])/float64(s[1]), 'f', -1, 64)
		}
		assert.Equal(t, wantAvg, gotAvg, "avg by (fleet) via %s", name)

		code, body = getBody(t, n.base+"/api/v1/query?"+url.Values{"query": {"time() - telemetry_device_last_seen_timestamp_seconds > 600"}, "time": {at}}.Encode())
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `"device":"truck_00"`, "via %s", name)
		assert.Equal(t, 1, strings.Count(body, `"device":`), "only truck_00 is silent, via %s: %s", name, body)
	}

	// A refusal keeps its code through any node.
	for _, n := range nodes {
		code, body := sendJSON(t, http.MethodPatch, n.base+"/v1/devices/truck_05/attributes", `{"fleet":"`+strings.Repeat("x", 257)+`"}`)
		assert.Equal(t, http.StatusBadRequest, code)
		assert.Contains(t, body, `"code":"invalid_attribute_value"`)
		assert.Contains(t, body, `"message":"attributes.fleet: `)
	}
}
