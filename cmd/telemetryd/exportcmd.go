package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
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

// defaultExportPage is the default -page: readings per request.
const defaultExportPage = 1_000_000

// exportRetries is how often a broken transfer is resumed before the
// export gives up.
const exportRetries = 5

// exportCmd holds the flags of `telemetryd export`.
type exportCmd struct {
	url, token, match, prefix, from, to, format, out string
	page                                             int64
	progressEvery                                    time.Duration
}

// flagSet binds the flags of `telemetryd export` to x and cfg.
func (x *exportCmd) flagSet(cfg *Config) *flag.FlagSet {
	fs := flag.NewFlagSet("telemetryd export", flag.ContinueOnError)
	cfg.bindSubset(fs, "data-dir", "log-level", "log-format")
	fs.StringVar(&x.url, "url", "", "base URL of a running service (http://host:8080); empty: read -data-dir")
	fs.StringVar(&x.token, "token", "", "bearer token with the read scope (with -url)")
	fs.StringVar(&x.match, "match", "", `Prometheus selector over device attributes and device, e.g. {fleet="East"}; empty: every device`)
	fs.StringVar(&x.prefix, "prefix", "", "keep devices whose ID starts with this")
	fs.StringVar(&x.from, "from", "", "inclusive start, RFC 3339 or epoch milliseconds; empty: the earliest reading")
	fs.StringVar(&x.to, "to", "", "exclusive end, RFC 3339 or epoch milliseconds; empty: now plus the accepted skew (-url) or no end")
	fs.StringVar(&x.format, "format", api.FormatNDJSON, "ndjson or csv")
	fs.StringVar(&x.out, "o", "", "write to this file instead of stdout")
	fs.Int64Var(&x.page, "page", defaultExportPage, "readings per request (with -url); a broken transfer resumes within its page")
	return fs
}

// runExport is `telemetryd export`.
func runExport(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	cfg := DefaultConfig()
	x := exportCmd{progressEvery: time.Second}
	fs := x.flagSet(&cfg)
	fs.SetOutput(stderr)
	setUsage(fs, exportUsage)
	if code, ok := parseSubcommand(fs, args, &cfg, getenv, stderr); !ok {
		return code
	}
	if x.format != api.FormatNDJSON && x.format != api.FormatCSV {
		fmt.Fprintf(stderr, "telemetryd export: -format %q is not ndjson or csv\n", x.format)
		return 2
	}
	if x.page < 1 {
		fmt.Fprintf(stderr, "telemetryd export: -page %d is not positive\n", x.page)
		return 2
	}
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	out, closeOut, err := openExportOutput(x.out, stdout)
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd export:", err)
		return 1
	}
	w := bufio.NewWriterSize(out, 256<<10)
	p := &exportProgress{w: stderr, every: x.progressEvery, start: time.Now(), next: time.Now().Add(x.progressEvery)}
	var n int64
	if x.url != "" {
		n, err = x.remote(ctx, w, p)
	} else {
		n, err = x.local(ctx, cfg, w, p, stderr)
	}
	if ferr := w.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("write output: %w", ferr)
	}
	if cerr := closeOut(); err == nil && cerr != nil {
		err = fmt.Errorf("close output: %w", cerr)
	}
	p.done(n)
	if err != nil {
		fmt.Fprintln(stderr, "telemetryd export:", err)
		return 1
	}
	return 0
}

func openExportOutput(path string, stdout io.Writer) (io.Writer, func() error, error) {
	if path == "" || path == "-" {
		return stdout, func() error { return nil }, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, nil, fmt.Errorf("create output: %w", err)
	}
	return f, f.Close, nil
}

// local exports from a stopped service's data dir.
func (x *exportCmd) local(ctx context.Context, cfg Config, w io.Writer, p *exportProgress, stderr io.Writer) (int64, error) {
	o := api.ExportOptions{Match: x.match, Prefix: x.prefix, Format: x.format}
	var err error
	if x.from != "" {
		if o.From, err = buckets.ParseTime(x.from); err != nil {
			return 0, fmt.Errorf("-from: %w", err)
		}
	}
	if x.to != "" {
		if o.To, err = buckets.ParseTime(x.to); err != nil {
			return 0, fmt.Errorf("-to: %w", err)
		}
	}
	sopts := store.DefaultOptions()
	sopts.ReadOnly = true
	sopts.Logger = newLogger(cfg, stderr).With("component", "export")
	st, err := store.Open(ctx, cfg.DataDir, sopts)
	if errors.Is(err, store.ErrLocked) {
		return 0, fmt.Errorf("%s is in use by a running telemetryd; export through it with -url http://<http-addr>", cfg.DataDir)
	}
	if err != nil {
		return 0, err
	}
	defer st.Close()
	return api.Export(ctx, st, o, w, p.update)
}

// remote exports from a running service, page by page, resuming a
// broken transfer behind the last complete reading written.
func (x *exportCmd) remote(ctx context.Context, w io.Writer, p *exportProgress) (int64, error) {
	base, err := url.Parse(strings.TrimRight(x.url, "/") + "/v1/export")
	if err != nil || (base.Scheme != "http" && base.Scheme != "https") || base.Host == "" {
		return 0, fmt.Errorf("-url %q is not an http:// or https:// URL", x.url)
	}
	client := &http.Client{Transport: http.DefaultTransport}
	c := &exportCopier{w: w, csv: x.format == api.FormatCSV, p: p}
	cursor, retries := "", 0
	for {
		v := url.Values{"format": {x.format}, "limit": {strconv.FormatInt(x.page, 10)}}
		if cursor != "" {
			v.Set("cursor", cursor)
		} else {
			for k, s := range map[string]string{"match": x.match, "prefix": x.prefix, "from": x.from, "to": x.to} {
				if s != "" {
					v.Set(k, s)
				}
			}
		}
		u := *base
		u.RawQuery = v.Encode()
		next, retry, err := x.fetch(ctx, client, u.String(), c)
		switch {
		case err == nil && next == "":
			return c.readings, nil
		case err == nil:
			cursor, retries = next, 0
		case retry && retries < exportRetries && ctx.Err() == nil:
			retries++
			fmt.Fprintf(p.w, "telemetryd export: %v; resuming (%d of %d)\n", err, retries, exportRetries)
			c.resume()
			select {
			case <-time.After(time.Duration(retries) * time.Second):
			case <-ctx.Done():
				return c.readings, ctx.Err()
			}
		default:
			return c.readings, err
		}
	}
}

// fetch asks one page and copies it. retry reports an error worth
// resuming after (a broken transfer, a refusal for load).
func (x *exportCmd) fetch(ctx context.Context, client *http.Client, u string, c *exportCopier) (next string, retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", false, fmt.Errorf("request: %w", err)
	}
	if x.token != "" {
		req.Header.Set("Authorization", "Bearer "+x.token)
	}
	res, err := client.Do(req)
	if err != nil {
		return "", true, fmt.Errorf("request: %w", err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
		retry := res.StatusCode == http.StatusTooManyRequests || res.StatusCode == http.StatusServiceUnavailable
		return "", retry, fmt.Errorf("%s: %s", res.Status, bytes.TrimSpace(body))
	}
	if err := c.copy(res.Body); err != nil {
		return "", !errors.Is(err, errExportOutput), err
	}
	return res.Trailer.Get("Export-Next"), false, nil
}

// errExportOutput marks a failure to write the output (not worth a
// retry).
var errExportOutput = errors.New("write output")

// exportCopier copies export responses to the output a whole record at
// a time (a CSV record may span lines inside quotes), drops the repeated
// CSV header and the NDJSON cursor lines, and after a broken transfer
// drops what it already wrote.
type exportCopier struct {
	w        io.Writer
	csv      bool
	p        *exportProgress
	header   bool   // the CSV header was written
	rec      []byte // the record being read
	last     []byte // the last record written
	lastKey  []byte // device and ts of the last CSV row written
	skipTo   []byte // after a resume: skip records up to this one
	readings int64
}

// resume makes the next response skip what was written already.
func (c *exportCopier) resume() {
	if len(c.last) > 0 {
		c.skipTo = append(c.skipTo[:0], c.last...)
	}
}

func (c *exportCopier) copy(body io.Reader) error {
	r := bufio.NewReaderSize(body, 256<<10)
	first := true
	for {
		line, err := r.ReadSlice('\n')
		c.rec = append(c.rec, line...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if err != nil {
			c.rec = c.rec[:0] // an incomplete record is never written
			if err == io.EOF {
				return nil
			}
			return fmt.Errorf("read response: %w", err)
		}
		if c.csv && bytes.Count(c.rec, []byte{'"'})%2 == 1 {
			continue // a line break inside a quoted value
		}
		rec := c.rec
		c.rec = c.rec[:0]
		if err := c.record(rec, first); err != nil {
			return err
		}
		first = false
	}
}

// record handles one complete record of a response.
func (c *exportCopier) record(rec []byte, first bool) error {
	switch {
	case c.csv && first:
		if c.header {
			return nil
		}
		c.header = true
		return c.write(rec)
	case !c.csv && bytes.HasPrefix(rec, []byte(`{"next":`)):
		return nil
	}
	if c.skipTo != nil {
		if exportBefore(rec, c.skipTo, c.csv) {
			return nil
		}
		c.skipTo = nil
	}
	if c.csv {
		key := csvKey(rec)
		if !bytes.Equal(key, c.lastKey) {
			c.readings++
			c.lastKey = append(c.lastKey[:0], key...)
		}
	} else {
		c.readings++
	}
	c.last = append(c.last[:0], rec...)
	if err := c.write(rec); err != nil {
		return err
	}
	if c.readings%1024 == 0 {
		c.p.update(c.readings)
	}
	return nil
}

func (c *exportCopier) write(b []byte) error {
	if _, err := c.w.Write(b); err != nil {
		return fmt.Errorf("%w: %w", errExportOutput, err)
	}
	return nil
}

// csvKey is the device,ts part of a CSV row.
func csvKey(rec []byte) []byte {
	i := bytes.IndexByte(rec, ',')
	if i < 0 {
		return rec
	}
	j := bytes.IndexByte(rec[i+1:], ',')
	if j < 0 {
		return rec
	}
	return rec[:i+1+j]
}

// exportBefore reports whether record rec comes at or before record
// last in export order: device, then time, then (CSV) value name.
func exportBefore(rec, last []byte, csv bool) bool {
	d1, t1, n1 := exportPosOf(rec, csv)
	d2, t2, n2 := exportPosOf(last, csv)
	if d1 != d2 {
		return d1 < d2
	}
	if t1 != t2 {
		return t1 < t2
	}
	return n1 <= n2
}

// exportPosOf reads device, time and (CSV) value name of a record.
func exportPosOf(rec []byte, csv bool) (dev string, ts buckets.Ticks, name string) {
	if csv {
		f := strings.SplitN(string(rec), ",", 4)
		if len(f) < 3 {
			return "", 0, ""
		}
		ts, _ = buckets.ParseTime(f[1])
		return f[0], ts, f[2]
	}
	s := string(rec)
	dev = between(s, `{"device":"`, `"`)
	ts, _ = buckets.ParseTime(between(s, `"ts":"`, `"`))
	return dev, ts, ""
}

func between(s, start, end string) string {
	_, after, ok := strings.Cut(s, start)
	if !ok {
		return ""
	}
	v, _, _ := strings.Cut(after, end)
	return v
}

// exportProgress reports progress on stderr at most once per every.
type exportProgress struct {
	w           io.Writer
	every       time.Duration
	start, next time.Time
}

// update reports n readings written when the last report is old enough.
func (p *exportProgress) update(n int64) {
	if now := time.Now(); now.After(p.next) {
		p.next = now.Add(p.every)
		fmt.Fprintf(p.w, "telemetryd export: %d readings, %.0f/s\n", n, float64(n)/now.Sub(p.start).Seconds())
	}
}

func (p *exportProgress) done(n int64) {
	d := time.Since(p.start)
	fmt.Fprintf(p.w, "telemetryd export: %d readings in %s (%.0f/s)\n", n, d.Round(time.Millisecond), float64(n)/d.Seconds())
}
