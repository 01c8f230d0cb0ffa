// Package backupcli is `telemetryd backup` and `telemetryd restore`:
// a backup of a stopped data dir or, through POST /v1/backup, of a
// running service, and a data dir rebuilt from a backup.
package backupcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/telemetryd/telemetryd/cmd/internal/backupclient"
	"github.com/telemetryd/telemetryd/cmd/internal/subcmd"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/backup"
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
	to, url, token string
	full           bool
}

// BackupFlagSet returns the flags of `telemetryd backup`, writing its
// usage to stderr.
func BackupFlagSet(stderr io.Writer, sh subcmd.Shared) *flag.FlagSet {
	fs, _ := backupFlags(stderr, sh)
	return fs
}

// backupFlags binds the flags of `telemetryd backup`.
func backupFlags(stderr io.Writer, sh subcmd.Shared) (*flag.FlagSet, *backupArgs) {
	a := &backupArgs{}
	fs := flag.NewFlagSet("telemetryd backup", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sh.Bind(fs, "data-dir", "log-level", "log-format")
	fs.StringVar(&a.to, "to", "", "backup directory (created if missing; with -url, an absolute path on the service's machine)")
	fs.StringVar(&a.url, "url", "", "base URL of a running service to back up through POST /v1/backup (empty: back up -data-dir offline)")
	fs.StringVar(&a.token, "token", "", "bearer token with the admin scope, for -url")
	fs.BoolVar(&a.full, "full", false, "copy everything, starting a new chain, instead of only what changed since the previous backup in -to")
	sh.Usage(fs, backupUsage)
	return fs, a
}

// restoreArgs are the flags of `telemetryd restore`.
type restoreArgs struct {
	from string
}

// RestoreFlagSet returns the flags of `telemetryd restore`, writing its
// usage to stderr.
func RestoreFlagSet(stderr io.Writer, sh subcmd.Shared) *flag.FlagSet {
	fs, _ := restoreFlags(stderr, sh)
	return fs
}

// restoreFlags binds the flags of `telemetryd restore`.
func restoreFlags(stderr io.Writer, sh subcmd.Shared) (*flag.FlagSet, *restoreArgs) {
	a := &restoreArgs{}
	fs := flag.NewFlagSet("telemetryd restore", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sh.Bind(fs, "data-dir", "log-level", "log-format")
	fs.StringVar(&a.from, "from", "", "backup directory to restore from (its newest backup)")
	sh.Usage(fs, restoreUsage)
	return fs, a
}

// RunBackup is `telemetryd backup`; it returns the exit status.
func RunBackup(ctx context.Context, args []string, stdout, stderr io.Writer, sh subcmd.Shared) int {
	fs, a := backupFlags(stderr, sh)
	if code, ok := sh.Parse(fs, args); !ok {
		return code
	}
	cfg, to, url, token, full := sh.Values(), a.to, a.url, a.token, a.full
	if to == "" {
		fmt.Fprintln(stderr, "telemetryd backup: -to is required")
		return 2
	}
	if url != "" {
		return backupOnline(ctx, url, token, to, full, stdout, stderr)
	}
	sopts := subcmd.StoreOptions(cfg.Logger(stderr).With("component", "backup"))
	sopts.ReadOnly = true
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
	m, err := st.Backup(ctx, to, backup.Options{Full: full, Progress: backupclient.PrintProgress(stdout, "copied")})
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

// RunRestore is `telemetryd restore`; it returns the exit status.
func RunRestore(ctx context.Context, args []string, stdout, stderr io.Writer, sh subcmd.Shared) int {
	fs, a := restoreFlags(stderr, sh)
	if code, ok := sh.Parse(fs, args); !ok {
		return code
	}
	cfg, from := sh.Values(), a.from
	if from == "" {
		fmt.Fprintln(stderr, "telemetryd restore: -from is required")
		return 2
	}
	fmt.Fprintf(stdout, "verifying the files of %s ...\n", from)
	m, err := store.Restore(ctx, from, cfg.DataDir, backup.RestoreOptions{
		Progress: backupclient.PrintProgress(stdout, "loaded"),
		Logger:   cfg.Logger(stderr).With("component", "restore"),
		Keep:     []string{embeddedNATSDir},
	})
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd", err)
		return 1
	}
	rollups := ""
	if len(m.Rollups) > 0 {
		rollups = fmt.Sprintf(", %d rollup databases (start it with the same -rollups)", len(m.Rollups))
	}
	fmt.Fprintf(stdout, "restored backup %d of %s (taken %s) into %s: %d tables%s\n",
		m.ID, from, m.Created.Format(time.RFC3339), cfg.DataDir, len(m.Tables), rollups)
	fmt.Fprintf(stdout, "stream positions: %s\n", backupclient.PositionsText(m.Sequences()))
	fmt.Fprintln(stdout, "start telemetryd on this data dir: it resumes each stream after these positions, so the stream must still hold the messages after them (-stream-max-age)")
	return 0
}

// embeddedNATSDir is the embedded NATS server's store under the data
// dir: the stream, which a restore leaves in place.
const embeddedNATSDir = "nats"
