package main

import (
	"context"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/retention"
	"github.com/telemetryd/telemetryd/store"
)

// admin implements api.Admin over the store and the retention worker.
type admin struct {
	store *store.Store
	ret   *retention.Worker
}

// DropTable drops one day table now, on an operator's request.
func (a admin) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	d, err := a.store.DropTable(ctx, day)
	if err != nil {
		return d, err
	}
	d.Reason = retention.ReasonManual // the API handler logs the drop, once
	if a.ret != nil {
		a.ret.CountDrop(ctx, d)
	}
	return d, nil
}

// countManualDrop counts an operator's drop done on this node (a
// cluster-wide drop reaches every node's store) in the retention
// counters.
func (m *Main) countManualDrop(ctx context.Context, d buckets.TableDrop) {
	d.Reason = retention.ReasonManual
	if m.ret != nil {
		m.ret.CountDrop(ctx, d)
	}
}

// DeleteDevice deletes one device from the store, on an operator's
// request.
func (a admin) DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	return a.store.DeleteDevice(ctx, dev)
}

// RunRetention runs the retention policy once.
func (a admin) RunRetention(ctx context.Context, dryRun bool) (buckets.RetentionReport, error) {
	return a.ret.RunOnce(ctx, dryRun)
}
