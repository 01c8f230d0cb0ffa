package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClusterExport: three nodes, every partition on two of them. An
// export through any node has every matching device once, in ID order,
// each with all its readings, and a cursor made by one node continues
// on another.
func TestClusterExport(t *testing.T) {
	inLane(t, lanes.cluster)
	const trucks, perTruck = 12, 5
	nc := startNATSCluster(t, 1)
	nodes := startConvergedNodes(t, nc, 3, 2, func(*Config) {})
	js := jsFor(t, nc.url(0))
	var acks []jetstream.PubAckFuture
	var want []string
	for i := range trucks {
		dev := fmt.Sprintf("truck_%02d", i)
		for j := range perTruck {
			at := testEpoch.Add(-time.Duration(perTruck-j) * time.Minute)
			a, err := js.PublishAsync("telemetry."+dev, fmt.Appendf(nil, `{"ts":%d,"load":%d}`, at.UnixMilli(), 10*i+j))
			require.NoError(t, err)
			acks = append(acks, a)
			if i%2 == 0 {
				want = append(want, fmt.Sprintf(`{"device":"%s","ts":"%s"`, dev, at.UTC().Format(time.RFC3339Nano)))
			}
		}
	}
	awaitAcks(t, acks)
	waitFor(t, 100*time.Millisecond, func() bool {
		total := 0
		for _, n := range nodes {
			total += localDevices(t, n.main())
		}
		return total == 2*trucks
	}, "every truck stored on its two owners")
	for i := 0; i < trucks; i += 2 {
		code, body := sendJSON(t, http.MethodPut, nodes[i%3].base+"/v1/devices/"+fmt.Sprintf("truck_%02d", i)+"/attributes", `{"fleet":"East"}`)
		require.Equal(t, http.StatusOK, code, body)
	}

	q := url.Values{"match": {`{fleet="East"}`}, "to": {fmt.Sprint(testEpoch.UnixMilli())}}
	heads := func(body string) []string {
		var out []string
		for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
			if strings.HasPrefix(line, `{"next":`) {
				continue
			}
			i := strings.Index(line, `,"partitionKey"`)
			require.Positive(t, i, line)
			out = append(out, line[:i])
		}
		return out
	}
	for _, n := range nodes {
		code, body := getBody(t, n.base+"/v1/export?"+q.Encode())
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, want, heads(body), "through %s", n.cfg.Cluster.NodeName)
	}

	// Pages of 7 readings, each asked of the next node.
	var got []string
	cursor := ""
	for page := 0; ; page++ {
		pq := url.Values{"limit": {"7"}}
		if cursor == "" {
			pq = q
			pq.Set("limit", "7")
		} else {
			pq.Set("cursor", cursor)
		}
		res, err := http.Get(nodes[page%3].base + "/v1/export?" + pq.Encode())
		require.NoError(t, err)
		body, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		require.NoError(t, res.Body.Close())
		require.Equal(t, http.StatusOK, res.StatusCode, "%s", body)
		got = append(got, heads(string(body))...)
		if cursor = res.Trailer.Get("Export-Next"); cursor == "" {
			break
		}
	}
	assert.Equal(t, want, got)
}
