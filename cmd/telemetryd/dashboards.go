package main

import (
	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/store"
)

// withDashboards wires the dashboard parts of the API (aggregates,
// the Prometheus query API and the built-in page) to the store. The
// service and its tests share it, so tests run what the service runs.
func withDashboards(c *api.Config, st *store.Store) {
	c.Aggregator = rangeAggregator{r: st}
}
