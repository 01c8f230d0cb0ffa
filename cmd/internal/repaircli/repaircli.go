// Package repaircli is `telemetryd repair`: it rebuilds a damaged day
// table of a stopped service's data dir.
package repaircli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/subcmd"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/repair"
)

// repairUsage heads `telemetryd repair -h`.
const repairUsage = `telemetryd repair: rebuild the day table of -day of a stopped service's
data dir from what can still be read of it and, with -backup, the newest
backup in that directory. The damaged table is moved to
<data-dir>/damaged/<day>-<time> (remove it when satisfied). At its next
start the service writes again what its stream still holds of the day
(readings merge: nothing is stored twice), and the readings that waited
unacked in the stream are committed. A running service does the same
on POST /v1/tables/<day>/repair.

Exit status: 0 repaired, 1 the repair failed, 2 bad usage.

Usage:
  telemetryd repair -day YYYY-MM-DD [-backup DIR] [flags]

Flags:
`

// FlagSet is the flag set of `telemetryd repair` (for documentation
// checks).
func FlagSet(out io.Writer, sh subcmd.Shared) *flag.FlagSet {
	fs, _, _ := newFlagSet(out, sh)
	return fs
}

func newFlagSet(out io.Writer, sh subcmd.Shared) (fs *flag.FlagSet, day, backup *string) {
	fs = flag.NewFlagSet("telemetryd repair", flag.ContinueOnError)
	fs.SetOutput(out)
	sh.Bind(fs, "data-dir", "log-level", "log-format")
	day = fs.String("day", "", "the UTC day of the table to repair, YYYY-MM-DD (required)")
	backup = fs.String("backup", "", "a backup directory (POST /v1/backup's) whose newest copy of the day is loaded first")
	sh.Usage(fs, repairUsage)
	return fs, day, backup
}

// Run is `telemetryd repair`. It returns the exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, sh subcmd.Shared) int {
	fs, dayFlag, backup := newFlagSet(stderr, sh)
	if code, ok := sh.Parse(fs, args); !ok {
		return code
	}
	day, err := buckets.ParseDay(*dayFlag)
	if err != nil {
		fmt.Fprintf(stderr, "telemetryd repair: -day %q: %v\n", *dayFlag, err)
		return 2
	}
	cfg := sh.Values()
	sopts := subcmd.StoreOptions(cfg.Logger(stderr).With("component", "repair"))
	st, err := store.Open(ctx, cfg.DataDir, sopts)
	if errors.Is(err, store.ErrLocked) {
		fmt.Fprintf(stderr, "telemetryd repair: %s is in use by a running telemetryd; stop it first, or ask it: POST /v1/tables/%s/repair\n", cfg.DataDir, day)
		return 1
	}
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd repair:", err)
		return 1
	}
	rep, err := st.RepairTable(ctx, day, repair.Options{Backup: *backup})
	if err == nil {
		err = st.MarkReplay(day)
	}
	if cerr := st.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd repair:", err)
		return 1
	}
	fmt.Fprintf(stdout, "repaired day %s: %d readings from the backup, %d salvaged from the damaged table (%d corrupt blocks, %d devices and %d table files unreadable)\n",
		day, rep.FromBackup, rep.Salvaged, rep.BadBlocks, rep.SkippedDevices, rep.SkippedFiles)
	if rep.SalvageErr != "" {
		fmt.Fprintf(stdout, "the damaged table did not open (it was read file by file): %s\n", rep.SalvageErr)
	}
	fmt.Fprintf(stdout, "damaged table moved to %s\nthe service writes the stream's readings of the day again at its next start\n", rep.Damaged)
	return 0
}
