package main

import (
	"context"
	"slices"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/cmd/internal/clusterstreams"
	"github.com/telemetryd/telemetryd/ingest/ownership"
)

// clusterView answers GET /v1/cluster from the leases.
type clusterView struct {
	m       *ownership.Membership
	streams *clusterstreams.Streams // nil with the one stream
}

func (v clusterView) ClusterStatus(ctx context.Context) (api.ClusterStatus, error) {
	st := api.ClusterStatus{Node: v.m.Node(), Partitions: v.m.Partitions(), Copies: v.m.Copies(),
		Nodes: []api.ClusterNode{}, Layout: make([]api.PartitionOwners, v.m.Partitions())}
	for _, l := range v.m.Nodes() {
		st.Nodes = append(st.Nodes, api.ClusterNode{Node: l.Node, URL: l.URL, Ready: orEmpty(l.Ready),
			Holding: orEmpty(l.Holding), Trailing: orEmpty(l.Trailing), Lag: l.Lag, Renewed: l.Renewed.UTC()})
	}
	for p := range st.Layout {
		po := api.PartitionOwners{Partition: p, Owners: orEmpty(v.m.Desired(p)), CaughtUp: []string{}}
		for _, o := range v.m.Owners(p) {
			po.CaughtUp = append(po.CaughtUp, o.Node)
		}
		slices.Sort(po.CaughtUp)
		st.Layout[p] = po
	}
	if v.streams != nil {
		st.Streams = v.streams.Status(ctx)
	}
	return st, nil
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
