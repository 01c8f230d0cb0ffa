package main

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/store/repair"
)

// repairingAdmin is the single node's admin: it also repairs day
// tables (api.Repairer), replaying the stream's readings of the day.
type repairingAdmin struct {
	admin
	m *Main
}

// RepairTable rebuilds the table of day (store.RepairTable) and writes
// again what the stream holds of the day (ingest.ReplayDay).
func (a repairingAdmin) RepairTable(ctx context.Context, day buckets.Day, backup string) (api.TableRepair, error) {
	rep, err := a.store.RepairTable(ctx, day, repair.Options{Backup: backup})
	out := api.TableRepair{Day: day.String(), FromBackup: rep.FromBackup, Salvaged: rep.Salvaged,
		BadBlocks: rep.BadBlocks, SkippedDevices: rep.SkippedDevices, SalvageError: rep.SalvageErr, DamagedCopy: rep.Damaged}
	if err != nil {
		return out, err
	}
	n, err := a.m.replayDay(ctx, day)
	out.FromStream = n
	if err != nil {
		return out, fmt.Errorf("table %s rebuilt; replaying the stream's readings of the day failed (retry the repair): %w", day, err)
	}
	return out, nil
}

// replayDay writes again the readings of day that the readings
// streams (one per partition, or the one) hold.
func (m *Main) replayDay(ctx context.Context, day buckets.Day) (int64, error) {
	js, err := jetstream.New(m.nc)
	if err != nil {
		return 0, err
	}
	var n int64
	icfg := m.ingestConfig()
	if m.cluster != nil {
		icfg = m.cluster.icfg // partitioned subjects (and streams)
	}
	for _, c := range icfg.PerStream() {
		k, err := ingest.ReplayDay(ctx, js, c, day, m.store, m.store)
		n += k
		if err != nil {
			return n, err
		}
	}
	m.log.Info("stream readings of a repaired day written again", "day", day.String(), "readings", n)
	return n, nil
}

// replayPending replays, then forgets, the days `telemetryd repair` rebuilt offline.
func (m *Main) replayPending(ctx context.Context) {
	for _, day := range m.store.PendingReplays() {
		if _, err := m.replayDay(ctx, day); err != nil {
			m.log.Error("replaying the stream's readings of a repaired day failed; retried at the next start (or POST /v1/tables/"+day.String()+"/repair)",
				"day", day.String(), "err", err)
			continue
		}
		if err := m.store.ClearReplay(day); err != nil {
			m.log.Warn("forget a replayed day", "day", day.String(), "err", err)
		}
	}
	m.replaying.Store(len(m.store.PendingReplays()) > 0)
}
