package api_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/routers/gorillamux"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
)

// fixedCluster is a cluster of two nodes and two partitions, one of
// them still being caught up on by its second owner, the other answered
// by node-1 from a copy trailing its stream.
type fixedCluster struct{}

func (fixedCluster) ClusterStatus(context.Context) (api.ClusterStatus, error) {
	at := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	return api.ClusterStatus{Node: "node-0", Partitions: 2, Copies: 2,
		Nodes: []api.ClusterNode{
			{Node: "node-0", URL: "http://node-0:8080", Ready: []int{0, 1}, Holding: []int{0, 1}, Trailing: []int{}, Renewed: at},
			{Node: "node-1", URL: "http://node-1:8080", Ready: []int{0}, Holding: []int{0, 1}, Trailing: []int{0}, Lag: 1200, Renewed: at},
		},
		Layout: []api.PartitionOwners{
			{Partition: 0, Owners: []string{"node-1", "node-0"}, CaughtUp: []string{"node-0", "node-1"}},
			{Partition: 1, Owners: []string{"node-0", "node-1"}, CaughtUp: []string{"node-0"}},
		}}, nil
}

// GET /v1/cluster answers what the cluster view says, as documented; a
// single node answers 404.
func TestClusterStatus(t *testing.T) {
	doc := loadOpenAPI(t)
	router, err := gorillamux.NewRouter(doc)
	require.NoError(t, err)

	env := newTestEnv(t, func(c *api.Config) { c.Cluster = fixedCluster{} })
	validateExchange(t, env, router, exchange{name: "cluster", method: "GET", path: "/v1/cluster", status: 200})
	res := env.get(t, "/v1/cluster")
	var got api.ClusterStatus
	require.NoError(t, json.Unmarshal(res.body, &got))
	want, _ := fixedCluster{}.ClusterStatus(context.Background())
	assert.Equal(t, want, got)

	single := newTestEnv(t)
	validateExchange(t, single, router, exchange{name: "single node", method: "GET", path: "/v1/cluster", status: 404})
	msg := requireError(t, single.get(t, "/v1/cluster"), 404, "not_found", "path")
	assert.Contains(t, msg, "not part of a cluster")
}

// GET /v1/cluster needs the read scope.
func TestClusterStatusNeedsRead(t *testing.T) {
	env := newTestEnv(t, withAuth, func(c *api.Config) { c.Cluster = fixedCluster{} })
	requireError(t, env.get(t, "/v1/cluster"), 401, "unauthenticated", "authorization")
	requireError(t, env.do(t, "GET", "/v1/cluster", bearer(writeOnly)...), 403, "permission_denied", "authorization")
	assert.Equal(t, 200, env.do(t, "GET", "/v1/cluster", bearer(readAll)...).status)
}
