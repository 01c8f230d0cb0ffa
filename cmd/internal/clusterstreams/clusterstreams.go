// Package clusterstreams looks after a cluster's streams per partition
// (telemetryd -partition-streams) on the node that leads the leases:
// it spreads the streams' leaders over the NATS servers and retires
// the one stream of the earlier layout once every owner drained it
// (the steps are package ingest/cluster's).
package clusterstreams

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/ingest"
	ingestcluster "github.com/telemetryd/telemetryd/ingest/cluster"
	"github.com/telemetryd/telemetryd/ingest/ownership"
)

// streamsEvery is how often the leader of the leases looks at the
// partition streams' leaders and at the old one stream.
const streamsEvery = 5 * time.Second

// Streams looks after a cluster's streams per partition
// (-partition-streams): the node leading the leases spreads their
// leaders over the NATS servers and retires the one stream of the
// earlier layout once every owner drained it (package ingest/cluster).
type Streams struct {
	js       jetstream.JetStream
	members  *ownership.Membership
	names    []string
	balancer *ingestcluster.Balancer
	old      *ingestcluster.OldStream // nil once gone
	log      *slog.Logger
}

// Open creates every partition's stream that is
// missing (so devices' publishes are taken before their owners run)
// and checks that the NATS server maps the devices' subjects to them.
func Open(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, members *ownership.Membership,
	icfg ingest.Config, log *slog.Logger) (*Streams, error) {
	ps := &Streams{js: js, members: members, names: icfg.Streams(), log: log}
	for _, c := range icfg.PerStream() {
		if _, err := ingest.EnsureStream(ctx, js, c, log); err != nil {
			return nil, err
		}
	}
	if err := ingest.CheckMapping(ctx, js, icfg); err != nil {
		return nil, fmt.Errorf("cluster: -partition-streams: %w", err)
	}
	ps.balancer = &ingestcluster.Balancer{NC: nc, JS: js, Streams: ps.names, Logger: log}
	ps.old = &ingestcluster.OldStream{JS: js, Family: icfg.Family(), Partitions: icfg.Partitions,
		Owners: members.Desired, Live: func() []string {
			var out []string
			for _, l := range members.Nodes() {
				out = append(out, l.Node)
			}
			return out
		}, Logger: log}
	return ps, nil
}

// Run balances the leaders and retires the old stream, on the node
// leading the leases, until ctx ends.
func (ps *Streams) Run(ctx context.Context) {
	t := time.NewTicker(streamsEvery)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !ps.leading() {
			continue
		}
		msg := ""
		if _, err := ps.balancer.Step(ctx); err != nil && ctx.Err() == nil {
			msg = err.Error()
		}
		if ps.old != nil {
			gone, err := ps.old.Step(ctx)
			switch {
			case err != nil && ctx.Err() == nil:
				msg += err.Error()
			case gone:
				ps.old = nil
			}
		}
		if msg != lastErr && msg != "" {
			ps.log.Warn("partition streams: balancing the leaders or retiring the old stream failed; tried again", "err", msg)
		}
		lastErr = msg
	}
}

// leading reports whether this node's name is the first among the live
// leases: that one node balances, the others stand by.
func (ps *Streams) leading() bool {
	var names []string
	for _, l := range ps.members.Nodes() {
		names = append(names, l.Node)
	}
	return len(names) > 0 && slices.Min(names) == ps.members.Node()
}

// Status is every partition's stream with its leader and replicas, as
// the NATS servers answer now.
func (ps *Streams) Status(ctx context.Context) []api.ClusterStream {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ls, _ := ingestcluster.Leaders(ctx, ps.js, ps.names) // a stream not answering shows no leader
	out := make([]api.ClusterStream, len(ps.names))
	for i, name := range ps.names {
		out[i] = api.ClusterStream{Stream: name, Replicas: []string{}}
		for _, l := range ls {
			if l.Stream == name {
				out[i].Leader, out[i].Replicas = l.Leader, l.Replicas
			}
		}
	}
	return out
}

// Names are the partitions' streams, in partition order.
func (ps *Streams) Names() []string { return ps.names }
