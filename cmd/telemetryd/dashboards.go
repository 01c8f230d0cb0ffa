package main

import (
	"context"
	"fmt"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/buckets"
)

// dashboardSource is what the dashboards read: the store, or the
// cluster router.
type dashboardSource interface {
	api.Aggregator
	promapi.Source
}

// deviceFilter is the store's device filter for the request of ctx:
// its token's device patterns, nil when it sees every device.
func deviceFilter(ctx context.Context) func(buckets.DeviceID) bool {
	p := auth.FromContext(ctx)
	if p.AllDevices() {
		return nil
	}
	return func(dev buckets.DeviceID) bool { return p.DeviceVisible(string(dev)) }
}

// withDashboards wires the dashboard parts of the API (aggregates,
// the Prometheus query API and the built-in page) to the store. The
// service and its tests share it, so tests run what the service runs.
func withDashboards(c *api.Config, st dashboardSource) error {
	c.Aggregator = st
	timeout := c.QueryTimeout
	if timeout == 0 {
		timeout = api.DefaultQueryTimeout
	}
	log := c.Logger
	if log != nil {
		log = log.With("component", "promql")
	}
	p, err := promapi.New(promapi.Config{Source: st, Timeout: timeout, Logger: log, Now: c.Now,
		MaxSamples: api.PromQLMaxSamples(c.ResponseBudget),
		// A token limited to device patterns sees only those devices in
		// series, label values and query results.
		Visible:   deviceFilter,
		Retention: c.Retention,
	})
	if err != nil {
		return fmt.Errorf("prometheus query api: %w", err)
	}
	c.PromQL = p
	return nil
}
