// Package retentioncli is `telemetryd retention`: it applies the
// retention policy once to a stopped service's data dir.
package retentioncli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/subcmd"
	"github.com/telemetryd/telemetryd/retention"
	"github.com/telemetryd/telemetryd/store"
)

// retentionUsage heads `telemetryd retention -h`.
const retentionUsage = `telemetryd retention: apply the retention policy once to the data dir of a
stopped service (a running service holds the directory; use its
POST /v1/retention/run instead). Prints one line per table and a summary.

Usage:
  telemetryd retention [-dry-run] [flags]

Every flag can also be set by the environment variable named beside it;
a flag on the command line wins.

Flags:
`

// Run is `telemetryd retention [-dry-run]`: it opens the data dir
// (refusing when a running service holds it), applies the policy once
// and prints one line per table and a summary. It returns the exit
// status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, sh subcmd.Shared) int {
	dryRun := false
	fs := flag.NewFlagSet("telemetryd retention", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sh.Bind(fs, "data-dir", "retention", "retention-max-bytes", "log-level", "log-format")
	fs.BoolVar(&dryRun, "dry-run", false, "list what would be dropped; change nothing")
	sh.Usage(fs, retentionUsage)
	if code, ok := sh.Parse(fs, args); !ok {
		return code
	}
	cfg := sh.Values()
	log := cfg.Logger(stderr)
	sopts := subcmd.StoreOptions(log)
	sopts.ReadOnly = dryRun
	st, err := store.Open(ctx, cfg.DataDir, sopts)
	if errors.Is(err, store.ErrLocked) {
		fmt.Fprintf(stderr, "telemetryd retention: %s is in use by a running telemetryd; use its admin endpoint instead: curl -X POST http://<http-addr>/v1/retention/run%s\n",
			cfg.DataDir, map[bool]string{true: "?dry_run=true", false: ""}[dryRun])
		return 1
	}
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd retention:", err)
		return 1
	}
	defer st.Close()

	before, err := st.Tables(ctx)
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd retention:", err)
		return 1
	}
	w, err := retention.NewWorker(st, retention.Config{
		Policy: retention.Policy{Retention: cfg.Retention, MaxBytes: cfg.RetentionMaxBytes},
		Logger: log.With("component", "retention"),
	})
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd retention:", err)
		return 1
	}
	rep, runErr := w.RunOnce(ctx, dryRun)
	printReport(stdout, before, rep)
	if runErr != nil {
		fmt.Fprintln(stderr, "telemetryd retention:", runErr)
		return 1
	}
	return 0
}

// printReport writes one line per table (day, size, readings, action)
// and a summary line.
func printReport(w io.Writer, tables []buckets.TableInfo, rep buckets.RetentionReport) {
	dropped := map[buckets.Day]buckets.TableDrop{}
	for _, d := range rep.Dropped {
		dropped[d.Day] = d
	}
	verb := "drop"
	if rep.DryRun {
		verb = "would drop"
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DAY\tSIZE_BYTES\tREADINGS\tACTION")
	var freed int64
	for _, t := range tables {
		action := "keep"
		if d, ok := dropped[t.Day]; ok {
			action = verb + " (" + d.Reason + ")"
			freed += t.SizeBytes
		}
		readings := "?"
		if t.Readings >= 0 {
			readings = fmt.Sprint(t.Readings)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", t.Day, t.SizeBytes, readings, action)
	}
	tw.Flush()
	fmt.Fprintf(w, "cutoff %s: %d tables %s, %d bytes freed, %d tables kept\n",
		rep.Cutoff.UTC().Format(time.RFC3339), len(rep.Dropped), map[bool]string{true: "would be dropped", false: "dropped"}[rep.DryRun],
		freed, rep.Kept)
}
