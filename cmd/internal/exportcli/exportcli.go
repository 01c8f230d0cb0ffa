// Package exportcli is `telemetryd export`: it writes readings as
// NDJSON or CSV from a running service or a stopped data dir.
package exportcli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/api/exportclient"
	"github.com/telemetryd/telemetryd/cmd/internal/subcmd"
	"github.com/telemetryd/telemetryd/store"
)

// exportUsage heads `telemetryd export -h`.
const exportUsage = `telemetryd export: write the readings of every matching device, devices in
ID order and each device's readings oldest first, as NDJSON (one reading
per line) or CSV (device,ts,name,value,type: one row per value), to
stdout or -o. With -url it asks a running service (GET /v1/export) a
page of -page readings at a time, and resumes a broken transfer behind
the last complete reading it wrote; without -url it reads the data dir
of a stopped service. Progress goes to stderr.

Usage:
  telemetryd export -url http://host:8080 [-match '{fleet="East"}'] [-from T] [-to T] [-format csv] [-o FILE]
  telemetryd export -data-dir D [flags]

Every flag can also be set by the environment variable named beside it;
a flag on the command line wins. Pass the token in TELEMETRY_TOKEN rather
than -token: a command line is visible to every user of the host.

Flags:
`

// exportCmd holds the flags of `telemetryd export`.
type exportCmd struct {
	exportclient.Query
	url, token, out string
	page            int64
}

// FlagSet returns the flags of `telemetryd export`, writing its usage
// to stderr.
func FlagSet(stderr io.Writer, sh subcmd.Shared) *flag.FlagSet {
	return new(exportCmd).flagSet(stderr, sh)
}

// flagSet binds the flags of `telemetryd export` to x and sh.
func (x *exportCmd) flagSet(stderr io.Writer, sh subcmd.Shared) *flag.FlagSet {
	fs := flag.NewFlagSet("telemetryd export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sh.Bind(fs, "data-dir", "log-level", "log-format")
	fs.StringVar(&x.url, "url", "", "base URL of a running service (http://host:8080); empty: read -data-dir")
	fs.StringVar(&x.token, "token", "", "bearer token with the read scope (with -url)")
	fs.StringVar(&x.Match, "match", "", `Prometheus selector over device attributes and device, e.g. {fleet="East"}; empty: every device`)
	fs.StringVar(&x.Prefix, "prefix", "", "keep devices whose ID starts with this")
	fs.StringVar(&x.From, "from", "", "inclusive start, RFC 3339 or epoch milliseconds; empty: the earliest reading")
	fs.StringVar(&x.To, "to", "", "exclusive end, RFC 3339 or epoch milliseconds; empty: now plus the accepted skew (-url) or no end")
	fs.StringVar(&x.Format, "format", api.FormatNDJSON, "ndjson or csv")
	fs.StringVar(&x.out, "o", "", "write to this file instead of stdout")
	fs.Int64Var(&x.page, "page", exportclient.DefaultPage, "readings per request (with -url); a broken transfer resumes within its page")
	sh.Usage(fs, exportUsage)
	return fs
}

// Run is `telemetryd export`: the remote path is an
// exportclient.Client, the offline one api.Export over the data dir
// opened read-only. It returns the exit status.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer, sh subcmd.Shared) int {
	var x exportCmd
	fs := x.flagSet(stderr, sh)
	if code, ok := sh.Parse(fs, args); !ok {
		return code
	}
	cfg := sh.Values()
	if x.Format != api.FormatNDJSON && x.Format != api.FormatCSV {
		fmt.Fprintf(stderr, "telemetryd export: -format %q is not ndjson or csv\n", x.Format)
		return 2
	}
	if x.page < 1 {
		fmt.Fprintf(stderr, "telemetryd export: -page %d is not positive\n", x.page)
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	err := x.export(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd export:", err)
		return 1
	}
	return 0
}

// export writes the export to -o or stdout, with progress on stderr.
func (x *exportCmd) export(ctx context.Context, cfg subcmd.Values, stdout, stderr io.Writer) (err error) {
	out, closeOut := stdout, func() error { return nil }
	if x.out != "" && x.out != "-" {
		f, err := os.Create(x.out)
		if err != nil {
			return fmt.Errorf("create output: %w", err)
		}
		out, closeOut = f, f.Close
	}
	w := bufio.NewWriterSize(out, 256<<10)
	p := exportclient.NewProgress(stderr, "telemetryd export: ", time.Second)
	var n int64
	if x.url != "" {
		c := &exportclient.Client{URL: x.url, Token: x.token, Page: x.page, OnResume: func(err error, attempt, retries int) {
			fmt.Fprintf(stderr, "telemetryd export: %v; resuming (%d of %d)\n", err, attempt, retries)
		}}
		n, err = c.Export(ctx, x.Query, w, p.Update)
	} else {
		n, err = x.local(ctx, cfg, w, p, stderr)
	}
	if ferr := w.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("write output: %w", ferr)
	}
	if cerr := closeOut(); err == nil && cerr != nil {
		err = fmt.Errorf("close output: %w", cerr)
	}
	p.Done(n)
	return err
}

// local exports from a stopped service's data dir.
func (x *exportCmd) local(ctx context.Context, cfg subcmd.Values, w io.Writer, p *exportclient.Progress, stderr io.Writer) (int64, error) {
	o, err := x.Options()
	if err != nil {
		return 0, fmt.Errorf("-%w", err)
	}
	sopts := store.DefaultOptions()
	sopts.ReadOnly = true
	sopts.Logger = cfg.Logger(stderr).With("component", "export")
	st, err := store.Open(ctx, cfg.DataDir, sopts)
	if errors.Is(err, store.ErrLocked) {
		return 0, fmt.Errorf("%s is in use by a running telemetryd; export through it with -url http://<http-addr>", cfg.DataDir)
	}
	if err != nil {
		return 0, err
	}
	defer st.Close()
	return api.Export(ctx, st, o, w, p.Update)
}
