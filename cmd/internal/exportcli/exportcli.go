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
// A source that cannot be read (a data dir in use, a bad query) fails
// before anything is written: no output file is made and no count is
// printed.
func (x *exportCmd) export(ctx context.Context, cfg subcmd.Values, stdout, stderr io.Writer) (err error) {
	var st *store.Store
	var o api.ExportOptions
	if x.url == "" {
		if st, o, err = x.openLocal(ctx, cfg, stderr); err != nil {
			return err
		}
		defer st.Close()
	}
	out := &lazyFile{w: stdout}
	if x.out != "" && x.out != "-" {
		out = &lazyFile{path: x.out}
	}
	w := bufio.NewWriterSize(out, 256<<10)
	p := exportclient.NewProgress(stderr, "telemetryd export: ", time.Second)
	var n int64
	if st == nil {
		c := &exportclient.Client{URL: x.url, Token: x.token, Page: x.page, OnResume: func(err error, attempt, retries int) {
			fmt.Fprintf(stderr, "telemetryd export: %v; resuming (%d of %d)\n", err, attempt, retries)
		}}
		n, err = c.Export(ctx, x.Query, w, p.Update)
	} else {
		n, err = api.Export(ctx, st, o, w, p.Update)
	}
	if ferr := w.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("write output: %w", ferr)
	}
	if err == nil {
		err = out.create() // an export of nothing still makes its (empty) file
	}
	if cerr := out.close(); err == nil && cerr != nil {
		err = fmt.Errorf("close output: %w", cerr)
	}
	if err != nil {
		if n > 0 {
			return fmt.Errorf("%w (%d readings were written before it)", err, n)
		}
		return err
	}
	p.Done(n)
	return nil
}

// openLocal opens a stopped service's data dir read-only for export.
func (x *exportCmd) openLocal(ctx context.Context, cfg subcmd.Values, stderr io.Writer) (*store.Store, api.ExportOptions, error) {
	o, err := x.Options()
	if err != nil {
		return nil, o, fmt.Errorf("-%w", err)
	}
	sopts := subcmd.StoreOptions(cfg.Logger(stderr).With("component", "export"))
	sopts.ReadOnly = true
	st, err := store.Open(ctx, cfg.DataDir, sopts)
	if errors.Is(err, store.ErrLocked) {
		return nil, o, fmt.Errorf("-data-dir %s is in use by a running telemetryd; export through it with -url http://<its -http-addr>", cfg.DataDir)
	}
	if err != nil {
		return nil, o, err
	}
	return st, o, nil
}

// lazyFile is the output: stdout (w), or the file path, created at the
// first write so that an export that fails before writing leaves no
// file behind.
type lazyFile struct {
	w    io.Writer
	path string
	f    *os.File
}

func (l *lazyFile) Write(b []byte) (int, error) {
	if err := l.create(); err != nil {
		return 0, err
	}
	return l.w.Write(b)
}

// create makes the file, once.
func (l *lazyFile) create() error {
	if l.w != nil {
		return nil
	}
	f, err := os.Create(l.path)
	if err != nil {
		return fmt.Errorf("create output: %w", err)
	}
	l.f, l.w = f, f
	return nil
}

func (l *lazyFile) close() error {
	if l.f == nil {
		return nil
	}
	return l.f.Close()
}
