package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/cmd/internal/backupclient"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/backup"
)

// backupService is the api.Backups of a running service; the API
// keeps its backups under -backup-dir.
type backupService struct{ store *store.Store }

// backupsOff is the -backup-dir that turns online backups off.
const backupsOff = "off"

// backupRoot is the directory POST /v1/backup writes under: -backup-dir,
// by default the data dir's absolute path with "-backups" appended (a
// sibling, so ./data keeps its backups in ./data-backups); empty when
// -backup-dir is off.
func (c Config) backupRoot() string {
	switch c.BackupDir {
	case backupsOff:
		return ""
	case "":
		dir, err := filepath.Abs(c.DataDir)
		if err != nil {
			return "" // no working directory: no default to offer
		}
		return dir + "-backups"
	}
	return c.BackupDir
}

// backups is the service's api.Backups, nil when -backup-dir is off.
func (m *Main) backups() api.Backups {
	if m.cfg.backupRoot() == "" {
		return nil
	}
	return backupService{store: m.store}
}

// Backup implements api.Backups.
func (b backupService) Backup(ctx context.Context, dir string, full bool) (api.BackupSummary, error) {
	m, err := b.store.Backup(ctx, dir, backup.Options{Full: full})
	if err != nil {
		return api.BackupSummary{}, err
	}
	return backupclient.SummaryOf(dir, m), nil
}

// resumeRestored prepares a data dir that restore made: the ingest
// consumer, if it outlived the restore, is deleted so that ingest
// creates it again after the restored positions. The marker is cleared
// after that, so a later start keeps the consumer.
func (m *Main) resumeRestored(icfg ingest.Config) error {
	if !m.store.Restored() {
		return nil
	}
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("resume after restore: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	left, err := ingest.LeftoverStreams(ctx, js, icfg) // drained after the restore's positions too
	if err != nil {
		return fmt.Errorf("resume after restore: %w", err)
	}
	for _, c := range append(icfg.PerStream(), left...) {
		deleted, err := ingest.ResetConsumer(ctx, js, c)
		if err != nil {
			return fmt.Errorf("resume after restore: %w", err)
		}
		if deleted {
			m.log.Info("data dir restored from a backup: deleted the ingest consumer so that it starts again after the backup's stream positions",
				"stream", c.Stream, "consumer", c.Consumer)
		}
	}
	return m.store.ClearRestored()
}
