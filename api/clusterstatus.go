package api

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
)

// ClusterView tells where a cluster's partitions live, as the nodes'
// leases say (GET /v1/cluster).
type ClusterView interface {
	ClusterStatus(ctx context.Context) (ClusterStatus, error)
}

// ClusterStatus is the answer of GET /v1/cluster: the cluster as the
// answering node sees it.
type ClusterStatus struct {
	// Node is the node that answered.
	Node       string `json:"node"`
	Partitions int    `json:"partitions"`
	Copies     int    `json:"copies"`
	// Nodes is every node with a live lease, by name.
	Nodes []ClusterNode `json:"nodes"`
	// Layout is every partition, in order.
	Layout []PartitionOwners `json:"layout"`
	// Streams is, with a stream per partition, every partition's
	// stream in order with the NATS server leading it (absent with the
	// one stream).
	Streams []ClusterStream `json:"streams,omitempty"`
}

// ClusterStream is one partition's stream and its NATS servers.
type ClusterStream struct {
	Stream string `json:"stream"`
	// Leader is the NATS server that takes the stream's writes (""
	// while none does, or when the servers did not answer).
	Leader string `json:"leader"`
	// Replicas are the other NATS servers holding the stream.
	Replicas []string `json:"replicas"`
}

// ClusterNode is one node's lease.
type ClusterNode struct {
	Node string `json:"node"`
	URL  string `json:"url"`
	// Ready lists the partitions the node has caught up on (answers
	// for), Holding those it consumes, both ascending.
	Ready   []int `json:"ready"`
	Holding []int `json:"holding"`
	// Trailing lists the partitions of Ready whose copy on the node
	// trails its stream: answers read from it are marked partial.
	Trailing []int `json:"trailing"`
	// Lag is the messages of its partitions the node had not settled
	// (not yet delivered, or delivered and not yet acked) when it last
	// renewed its lease.
	Lag uint64 `json:"lag"`
	// Renewed is when the node last renewed its lease.
	Renewed time.Time `json:"renewed"`
}

// PartitionOwners is where one partition lives.
type PartitionOwners struct {
	Partition int `json:"partition"`
	// Owners are the nodes that should store the partition, best
	// ranked first.
	Owners []string `json:"owners"`
	// CaughtUp are the nodes that have caught up on it, the ones
	// queries go to (an owner still catching up is missing; a node
	// handing the partition over is still there), by name.
	CaughtUp []string `json:"caughtUp"`
}

// registerCluster routes GET /v1/cluster (scope read).
func (s *Server) registerCluster(query []echo.MiddlewareFunc) {
	s.echo.GET("/v1/cluster", s.handleCluster, query...)
}

// handleCluster serves GET /v1/cluster; 404 on a single node.
func (s *Server) handleCluster(c echo.Context) error {
	if s.cluster == nil {
		return notFound("path", "this node is not part of a cluster (-partitions 0)")
	}
	st, err := s.cluster.ClusterStatus(c.Request().Context())
	if err != nil {
		return readerError(err, "cluster status")
	}
	return sendValue(c, http.StatusOK, st)
}
