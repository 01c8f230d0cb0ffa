// Package checkcli is `telemetryd check`: it verifies every stored
// block and device index record of a stopped service's data dir.
package checkcli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/telemetryd/telemetryd/cmd/internal/subcmd"
	"github.com/telemetryd/telemetryd/store"
)

// checkUsage heads `telemetryd check -h`.
const checkUsage = `telemetryd check: read every block of every day table and every device
index record of a stopped service's data dir, verify their checksums and
decode them, and compare the attribute index entities with the attribute
records. Prints one line per corrupt block (day, device, key, time span,
what is wrong) or record, then a summary. Changes nothing (a writable
start rewrites entities that disagree with the records).

Exit status: 0 nothing corrupt, 1 corruption found (or the check could
not run), 2 bad usage.

Usage:
  telemetryd check [flags]

Every flag can also be set by the environment variable named beside it;
a flag on the command line wins.

Flags:
`

// Run is `telemetryd check`: it opens the data dir read-only (refusing
// when a running service holds it) and reports every corrupt block and
// device index record. It returns the exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, sh subcmd.Shared) int {
	fs := flag.NewFlagSet("telemetryd check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sh.Bind(fs, "data-dir", "log-level", "log-format")
	sh.Usage(fs, checkUsage)
	if code, ok := sh.Parse(fs, args); !ok {
		return code
	}
	cfg := sh.Values()
	sopts := subcmd.StoreOptions(cfg.Logger(stderr).With("component", "check"))
	sopts.ReadOnly = true
	st, err := store.Open(ctx, cfg.DataDir, sopts)
	if errors.Is(err, store.ErrLocked) {
		fmt.Fprintf(stderr, "telemetryd check: %s is in use by a running telemetryd; stop it first\n", cfg.DataDir)
		return 1
	}
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd check:", err)
		return 1
	}
	defer st.Close()
	rep, err := st.Check(ctx, func(b store.BadBlock) {
		fmt.Fprintf(stdout, "corrupt block: %s: %v\n", b, b.Err)
	})
	printCheck(stdout, rep)
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd check:", err)
		return 1
	}
	if !rep.Clean() {
		return 1
	}
	return 0
}

// printCheck writes the corrupt records, the tables that could not be
// read and a summary line.
func printCheck(w io.Writer, rep store.CheckReport) {
	for _, r := range rep.Records {
		fmt.Fprintf(w, "corrupt device index record: device %s: %v\n", r.Device, r.Err)
	}
	for _, err := range rep.TableErrors {
		fmt.Fprintf(w, "unreadable day table: %v\n", err)
	}
	fmt.Fprintf(w, "checked %d attribute records, %d attribute index entities: %d missing entities, %d stray entities\n",
		rep.AttributeRecordsRead, rep.EntitiesRead, rep.MissingEntities, rep.StrayEntities)
	fmt.Fprintf(w, "checked %d tables, %d blocks, %d device index records: %d corrupt blocks, %d corrupt records, %d unreadable tables\n",
		rep.Tables, rep.BlocksRead, rep.RecordsRead, len(rep.Blocks), len(rep.Records), len(rep.TableErrors))
}
