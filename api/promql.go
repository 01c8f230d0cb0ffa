package api

import (
	"context"
	"fmt"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/api/promapi"
	"github.com/telemetryd/telemetryd/buckets"
)

// DashboardSource is what the dashboards read: the store, or the
// cluster router.
type DashboardSource interface {
	Aggregator
	promapi.Source
}

// WithDashboards sets the dashboard parts of c (aggregates and the
// Prometheus query API; the built-in page is always served) to read
// src, with c's query timeout, response budget, retention, clock and
// logger. A token limited to device patterns sees only those devices
// in series, label values and query results.
func (c *Config) WithDashboards(src DashboardSource) error {
	c.Aggregator = src
	timeout := c.QueryTimeout
	if timeout == 0 {
		timeout = DefaultQueryTimeout
	}
	log := c.Logger
	if log != nil {
		log = log.With("component", "promql")
	}
	p, err := promapi.New(promapi.Config{Source: src, Timeout: timeout, Logger: log, Now: c.Now,
		MaxSamples:       PromQLMaxSamples(c.ResponseBudget),
		Visible:          visibleDevices,
		Retention:        c.Retention,
		Extra:            c.AlertSeries,
		Build:            c.Build,
		ResultCacheBytes: PromQLResultBytes(c.ResponseBudget),
	})
	if err != nil {
		return fmt.Errorf("prometheus query api: %w", err)
	}
	c.PromQL = p
	return nil
}

// visibleDevices is the device filter for the request of ctx: its
// token's device patterns, nil when it sees every device.
func visibleDevices(ctx context.Context) func(buckets.DeviceID) bool {
	p := auth.FromContext(ctx)
	if p.AllDevices() {
		return nil
	}
	return func(dev buckets.DeviceID) bool { return p.DeviceVisible(string(dev)) }
}
