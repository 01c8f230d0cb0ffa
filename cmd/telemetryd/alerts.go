package main

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/prometheus/promql"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/api/rules"
	"github.com/telemetryd/telemetryd/cmd/internal/alerting"
)

// openAlerting loads -rules and adds the rules API and the alert series
// to acfg; the evaluation queries the PromQL API acfg ends up with.
// Without -rules it does nothing.
func (m *Main) openAlerting(ctx context.Context, acfg *api.Config) error {
	if m.cfg.Alerting.Rules == "" {
		return nil
	}
	js, err := jetstream.New(m.nc)
	if err != nil {
		return err
	}
	d := alerting.Deps{JetStream: js, Replicas: 1, Logger: m.log.With("component", "rules"), Now: m.now,
		Query: func(ctx context.Context, expr string, ts time.Time) (promql.Vector, error) {
			p, ok := acfg.PromQL.(*promapi.API)
			if !ok {
				return nil, errors.New("the PromQL engine is not available")
			}
			return p.Instant(ctx, expr, ts)
		},
		Batch: promapi.SharedReads, Keep: promapi.KeepValues}
	if acfg.Writes != nil {
		d.Publisher = acfg.Writes.Publisher
	}
	if c := m.cluster; c != nil {
		d.Replicas = m.cfg.Cluster.StreamReplicas
		d.Cluster = &alerting.Cluster{Self: m.cfg.Cluster.NodeName, LeaseTTL: m.cfg.Cluster.LeaseTTL,
			LeaseErr: c.members.LeaseErr, ServerNow: c.members.ServerNow,
			Nodes: func() map[string]time.Time {
				out := map[string]time.Time{}
				for _, l := range c.members.Nodes() {
					out[l.Node] = l.Renewed
				}
				return out
			}}
	}
	a, err := alerting.Open(ctx, m.cfg.Alerting, d)
	if err != nil {
		return err
	}
	m.alerts = a
	acfg.Alerts = &api.AlertsConfig{Handler: a.Manager.Handler(), Reload: a.Reload}
	acfg.AlertSeries = promapi.Extra{Names: rules.SeriesNames, Queryable: a.Manager.Series()}
	return nil
}

// ReloadRules loads the rule files again (SIGHUP); a bad file is
// logged and the old rules stay.
func (m *Main) ReloadRules(ctx context.Context) {
	if m.alerts == nil {
		m.log.Info("SIGHUP: no rule files to reload (-rules)")
		return
	}
	_ = m.alerts.Reload(ctx)
}
