package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/telemetryd/telemetryd/api"
)

// With -backup the loop takes an online backup (POST /v1/backup) every
// -backup-every while it publishes and kills, each incremental against
// the one before; a backup a kill interrupts is taken again. After the
// loop the service is stopped, its data dir is replaced by a restore of
// the newest backup (the embedded server's stream, under nats/, is
// moved over), and the service is started on it: it must catch up from
// the stream past the backup's positions, so the final check is the
// same: every acked reading stored exactly once.

// backupTaken is one backup of the run.
type backupTaken struct {
	At      time.Duration // since the loop started
	Acked   int64         // readings acked when it finished
	Summary api.BackupSummary
}

func (b backupTaken) String() string {
	return fmt.Sprintf("backup %d at %s (acked %d): %d tables, %d unchanged, copied %d bytes in %d files, restore loads %d bytes, positions %v",
		b.Summary.ID, b.At.Round(time.Second), b.Acked, b.Summary.Tables, b.Summary.Skipped, b.Summary.CopiedBytes,
		b.Summary.CopiedFiles, b.Summary.TotalBytes, b.Summary.Positions)
}

// backupLoop takes the backups of a -backup run.
type backupLoop struct {
	dir   string // the backup directory (under the service's -backup-dir)
	base  string // http://host:port of the service
	every time.Duration
	pub   *publisher
	log   *slog.Logger
	start time.Time

	mu    sync.Mutex
	taken []backupTaken
}

// run takes a backup every b.every until ctx ends.
func (b *backupLoop) run(ctx context.Context) {
	t := time.NewTicker(b.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for ctx.Err() == nil {
			sum, err := b.take(ctx)
			if err == nil {
				bt := backupTaken{At: time.Since(b.start), Acked: b.pub.acked.Load(), Summary: sum}
				b.log.Info("backup taken", "backup", bt.String())
				b.mu.Lock()
				b.taken = append(b.taken, bt)
				b.mu.Unlock()
				break
			}
			b.log.Info("backup failed; retrying", "err", err) // the kills cause it
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// take asks the service for one backup.
func (b *backupLoop) take(ctx context.Context) (api.BackupSummary, error) {
	body, _ := json.Marshal(api.BackupRequest{Dir: b.dir})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, b.base+"/v1/backup", bytes.NewReader(body))
	if err != nil {
		return api.BackupSummary{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return api.BackupSummary{}, err
	}
	defer res.Body.Close()
	out, err := io.ReadAll(res.Body)
	if err != nil {
		return api.BackupSummary{}, err
	}
	if res.StatusCode != http.StatusOK {
		return api.BackupSummary{}, fmt.Errorf("POST /v1/backup: %s: %s", res.Status, out)
	}
	var sum api.BackupSummary
	return sum, json.Unmarshal(out, &sum)
}

func (b *backupLoop) list() []backupTaken {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]backupTaken(nil), b.taken...)
}

// restoreService stops svc, restores the newest backup in dir into a
// fresh data dir under work, moves the stream over and starts svc on
// it.
func restoreService(ctx context.Context, svc *service, dir, work string, log *slog.Logger) error {
	if err := svc.stop(30 * time.Second); err != nil {
		return err
	}
	fresh := filepath.Join(work, "restored")
	if err := os.MkdirAll(fresh, 0o755); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(svc.dataDir, "nats"), filepath.Join(fresh, "nats")); err != nil {
		return fmt.Errorf("move the stream to the restored data dir: %w", err)
	}
	cmd := exec.CommandContext(ctx, svc.bin, "restore", "-from", dir, "-data-dir", fresh)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("telemetryd restore: %w: %s", err, out)
	}
	log.Info("restored", "data_dir", fresh, "output", string(out))
	svc.dataDir = fresh
	return svc.start(ctx)
}

// errNoBackup fails a -backup run that took no backup while it
// published.
var errNoBackup = errors.New("no backup was taken while publishing: lower -backup-every or publish longer")
