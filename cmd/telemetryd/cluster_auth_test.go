package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestClusterAuth: with an auth file, nodes call each other with the
// cluster token; a user's token keeps exactly its rights on every node
// (device patterns included, across routed and fanned-out requests);
// the node-to-node API takes only the cluster credential and applies
// the rights of the client a call names.
func TestClusterAuth(t *testing.T) {
	inLane(t, lanes.cluster)
	af := newAuthFixture(t, nil, "cluster:read,admin", "reader:read:sim-*", "narrowadmin:read,admin:sim-*", "writer:write")
	nc := startNATSCluster(t, 1)
	// One copy: every device on one node, so half the requests are routed.
	nodes := startConvergedNodes(t, nc, 2, 1, func(cfg *Config) {
		cfg.Security.AuthFile = af.path
		cfg.Cluster.ClusterToken = af.tokens["cluster"]
	})
	js := jsFor(t, nc.url(0))
	ctx := context.Background()
	for i := range 20 {
		for _, prefix := range []string{"sim", "dev"} {
			_, err := js.Publish(ctx, fmt.Sprintf("telemetry.%s-%d", prefix, i), fmt.Appendf(nil, `{"ts":%d,"v":%d}`, testEpoch.Add(-time.Hour).UnixMilli(), i))
			require.NoError(t, err)
		}
	}
	reader := af.tokens["reader"]

	// A line protocol write through one node is stored by the owners
	// of its device and read through the other.
	req, err := http.NewRequest("POST", nodes[1].base+"/api/v2/write?bucket=b&precision=ms",
		strings.NewReader(fmt.Sprintf("env,device=sim-lp t=21.5 %d\n", testEpoch.Add(-time.Hour).UnixMilli())))
	require.NoError(t, err)
	req.Header.Set("Authorization", "Token "+af.tokens["writer"])
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusNoContent, resp.StatusCode)
	waitFor(t, 50*time.Millisecond, func() bool {
		code, body := httpDo(t, nil, "GET", nodes[0].base+"/v1/devices/sim-lp/readings/latest", reader)
		return code == 200 && strings.Contains(body, `"env_t":21.5`)
	}, "the line protocol write is stored and read through the other node")
	for _, n := range nodes {
		waitFor(t, 50*time.Millisecond, func() bool {
			code, body := httpDo(t, nil, "GET", n.base+"/v1/devices?limit=100&prefix=sim-", reader)
			var l struct {
				Devices []struct{ Device string } `json:"devices"`
			}
			return code == 200 && json.Unmarshal([]byte(body), &l) == nil && len(l.Devices) == 21
		}, "a sim-* token lists the 21 sim devices through %s", n.cfg.Cluster.NodeName)
		for i := range 20 {
			code, body := httpDo(t, nil, "GET", fmt.Sprintf("%s/v1/devices/sim-%d/readings/latest", n.base, i), reader)
			assert.Equal(t, http.StatusOK, code, body)
			assert.Contains(t, body, `"v":`)
			code, _ = httpDo(t, nil, "GET", fmt.Sprintf("%s/v1/devices/dev-%d/readings/latest", n.base, i), reader)
			assert.Equal(t, http.StatusNotFound, code, "dev-%d is invisible to a sim-* token", i)
		}
		code, _ := httpDo(t, nil, "GET", n.base+"/v1/devices", "")
		assert.Equal(t, http.StatusUnauthorized, code)
		code, body := httpDo(t, nil, "GET", n.base+"/api/v1/query?query=count(v)&time="+fmt.Sprint(testEpoch.Add(-time.Hour+30*time.Second).Unix()), reader)
		assert.Equal(t, http.StatusOK, code)
		assert.Contains(t, body, `"20"`, "PromQL counts only the token's devices, across nodes")

		// The node-to-node API: the cluster credential only, with the
		// rights of the client it names.
		internal := func(token, caller string) int {
			code, _ := accessCall(t, "POST", n.base+"/internal/v1/latest", token, caller, `{"device":"dev-1","n":1}`)
			return code
		}
		assert.Equal(t, http.StatusUnauthorized, internal("", ""))
		assert.Equal(t, http.StatusForbidden, internal(reader, "token reader"), "a client token is not the cluster credential")
		assert.Equal(t, http.StatusForbidden, internal(af.tokens["narrowadmin"], "token cluster"), "nor is an admin token")
		assert.Equal(t, http.StatusForbidden, internal(af.tokens["cluster"], ""), "a call names the client it serves")
		assert.Equal(t, http.StatusNotFound, internal(af.tokens["cluster"], "token reader"), "dev-1 is outside reader's sim-*")
		assert.Equal(t, internalReadStatus(n, "dev-1"), internal(af.tokens["cluster"], "token cluster"))
	}
}
