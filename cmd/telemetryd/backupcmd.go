package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/backupclient"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/store"
)

// backupUsage heads `telemetryd backup -h`.
const backupUsage = `telemetryd backup: copy every day table and the device index into a
backup directory, with the stream positions the copy is consistent with.
A second backup into the same directory copies only what changed.

Offline, on a stopped service's data dir:
  telemetryd backup -data-dir D -to DIR
Online, through a running service (POST /v1/backup; DIR is on the
service's machine, under its -backup-dir):
  telemetryd backup -url http://HOST:PORT -to DIR [-token TOKEN]

Every flag can also be set by the environment variable named beside it;
a flag on the command line wins.

Flags:
`

// restoreUsage heads `telemetryd restore -h`.
const restoreUsage = `telemetryd restore: rebuild a data dir from the newest backup in a
backup directory. Every file is checked against the manifest's SHA-256
first; a corrupt or missing file stops the restore before anything is
written. The data dir must be new or empty. A service started on it
resumes the stream after the backup's positions, so a restore plus the
stream loses nothing the stream still holds.

Usage:
  telemetryd restore -from DIR -data-dir D

Flags:
`

// backupArgs are the flags of `telemetryd backup`.
type backupArgs struct {
	cfg            Config
	to, url, token string
	full           bool
}

// backupFlags binds the flags of `telemetryd backup`.
func backupFlags(stderr io.Writer) (*flag.FlagSet, *backupArgs) {
	a := &backupArgs{cfg: DefaultConfig()}
	fs := flag.NewFlagSet("telemetryd backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	a.cfg.bindSubset(fs, "data-dir", "log-level", "log-format")
	fs.StringVar(&a.to, "to", "", "backup directory (created if missing; with -url, an absolute path on the service's machine)")
	fs.StringVar(&a.url, "url", "", "base URL of a running service to back up through POST /v1/backup (empty: back up -data-dir offline)")
	fs.StringVar(&a.token, "token", "", "bearer token with the admin scope, for -url")
	fs.BoolVar(&a.full, "full", false, "copy everything, starting a new chain, instead of only what changed since the previous backup in -to")
	setUsage(fs, backupUsage)
	return fs, a
}

// restoreArgs are the flags of `telemetryd restore`.
type restoreArgs struct {
	cfg  Config
	from string
}

// restoreFlags binds the flags of `telemetryd restore`.
func restoreFlags(stderr io.Writer) (*flag.FlagSet, *restoreArgs) {
	a := &restoreArgs{cfg: DefaultConfig()}
	fs := flag.NewFlagSet("telemetryd restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	a.cfg.bindSubset(fs, "data-dir", "log-level", "log-format")
	fs.StringVar(&a.from, "from", "", "backup directory to restore from (its newest backup)")
	setUsage(fs, restoreUsage)
	return fs, a
}

// runBackup is `telemetryd backup`.
func runBackup(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs, a := backupFlags(stderr)
	if code, ok := parseSubcommand(fs, args, &a.cfg, getenv, stderr); !ok {
		return code
	}
	cfg, to, url, token, full := a.cfg, a.to, a.url, a.token, a.full
	if to == "" {
		fmt.Fprintln(stderr, "telemetryd backup: -to is required")
		return 2
	}
	if url != "" {
		return backupOnline(ctx, url, token, to, full, stdout, stderr)
	}
	sopts := store.DefaultOptions()
	sopts.ReadOnly = true
	sopts.Logger = newLogger(cfg, stderr).With("component", "backup")
	st, err := store.Open(ctx, cfg.DataDir, sopts)
	if errors.Is(err, store.ErrLocked) {
		fmt.Fprintf(stderr, "telemetryd backup: %s is in use by a running telemetryd; back it up through the service instead: "+
			"telemetryd backup -url http://<http-addr> -to <dir under its -backup-dir> (or POST /v1/backup)\n", cfg.DataDir)
		return 1
	}
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd backup:", err)
		return 1
	}
	defer st.Close()
	m, err := st.Backup(ctx, to, store.BackupOptions{Full: full, Progress: backupclient.PrintProgress(stdout, "copied")})
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd backup:", err)
		return 1
	}
	backupclient.PrintSummary(stdout, backupclient.SummaryOf(to, m))
	return 0
}

// backupOnline asks the service at base to take the backup.
func backupOnline(ctx context.Context, base, token, to string, full bool, stdout, stderr io.Writer) int {
	c, err := backupclient.New(base, token)
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd backup: -url:", err)
		return 2
	}
	fmt.Fprintf(stdout, "asking %s to back up into %s ...\n", base, to)
	sum, err := c.Backup(ctx, to, full)
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd backup:", err)
		return 1
	}
	backupclient.PrintSummary(stdout, sum)
	return 0
}

// runRestore is `telemetryd restore`.
func runRestore(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs, a := restoreFlags(stderr)
	if code, ok := parseSubcommand(fs, args, &a.cfg, getenv, stderr); !ok {
		return code
	}
	cfg, from := a.cfg, a.from
	if from == "" {
		fmt.Fprintln(stderr, "telemetryd restore: -from is required")
		return 2
	}
	fmt.Fprintf(stdout, "verifying the files of %s ...\n", from)
	m, err := store.Restore(ctx, from, cfg.DataDir, store.RestoreOptions{
		Progress: backupclient.PrintProgress(stdout, "loaded"),
		Logger:   newLogger(cfg, stderr).With("component", "restore"),
		Keep:     []string{embeddedNATSDir},
	})
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd", err)
		return 1
	}
	fmt.Fprintf(stdout, "restored backup %d of %s (taken %s) into %s: %d tables\n",
		m.ID, from, m.Created.Format(time.RFC3339), cfg.DataDir, len(m.Tables))
	fmt.Fprintf(stdout, "stream positions: %s\n", backupclient.PositionsText(m.Sequences()))
	fmt.Fprintln(stdout, "start telemetryd on this data dir: it resumes each stream after these positions, so the stream must still hold the messages after them (-stream-max-age)")
	return 0
}

// backupService is the api.Backups of a running service; the API
// keeps its backups under -backup-dir.
type backupService struct{ store *store.Store }

// backups is the service's api.Backups, nil when -backup-dir is empty.
func (m *Main) backups() api.Backups {
	if m.cfg.BackupDir == "" {
		return nil
	}
	return backupService{store: m.store}
}

// Backup implements api.Backups.
func (b backupService) Backup(ctx context.Context, dir string, full bool) (api.BackupSummary, error) {
	m, err := b.store.Backup(ctx, dir, store.BackupOptions{Full: full})
	if err != nil {
		return api.BackupSummary{}, err
	}
	return backupclient.SummaryOf(dir, m), nil
}

// embeddedNATSDir is the embedded NATS server's store under the data
// dir: the stream, which a restore leaves in place.
const embeddedNATSDir = "nats"

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
	deleted, err := ingest.ResetConsumer(ctx, js, icfg)
	if err != nil {
		return fmt.Errorf("resume after restore: %w", err)
	}
	if deleted {
		m.log.Warn("data dir restored from a backup: deleted the ingest consumer so that it starts again after the backup's stream positions",
			"stream", icfg.Stream, "consumer", icfg.Consumer)
	}
	return m.store.ClearRestored()
}
