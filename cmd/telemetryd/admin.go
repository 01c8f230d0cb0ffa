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
	d.Reason = "manual" // the API handler logs the drop, once
	return d, nil
}

// RunRetention runs the retention policy once.
func (a admin) RunRetention(ctx context.Context, dryRun bool) (buckets.RetentionReport, error) {
	return a.ret.RunOnce(ctx, dryRun)
}
