package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// An export streams the readings of many devices: devices in ID order
// (read from the device index a page at a time), each device's readings
// oldest first (read a page at a time), encoded into a buffer that is
// handed on whenever it fills a chunk. Memory is one page of readings
// and one chunk, whatever the size of the export. Each store call has
// its own deadline, so a long export is never cut short while it makes
// progress; the client must take each chunk within the stall timeout.
const (
	// exportPage is how many readings one store call of an export
	// reads (maxRangeLimit: the reservation of a full range page).
	exportPage = maxRangeLimit
	// exportDevicePage is how many devices one index call reads.
	exportDevicePage = 256
	// exportFlushEvery hands on a partly filled chunk when the last one
	// went out longer ago, so a slow export still shows progress.
	exportFlushEvery = time.Second
	// csvHeader is the first line of a CSV export.
	csvHeader = "device,ts,name,value,type\n"
)

// Export formats.
const (
	// FormatNDJSON writes one reading per line: the range API's reading
	// object with "device" first.
	FormatNDJSON = "ndjson"
	// FormatCSV writes one row per value: device,ts,name,value,type.
	FormatCSV = "csv"
)

// exportFormat is the format byte a cursor carries.
func exportFormat(name string) (byte, bool) {
	switch name {
	case FormatNDJSON:
		return 'n', true
	case FormatCSV:
		return 'c', true
	}
	return 0, false
}

// exportPos is the last reading an export delivered.
type exportPos struct {
	Device buckets.DeviceID
	Last   buckets.Ticks
}

// exportSpec is what an export streams.
type exportSpec struct {
	Prefix  string
	Match   []*buckets.Matcher
	From    buckets.Ticks // inclusive
	To      buckets.Ticks // exclusive
	CSV     bool
	Limit   int64 // readings at most; 0: no limit
	Visible func(buckets.DeviceID) bool
	// After resumes behind this reading; nil: from the start.
	After *exportPos
}

// exporter runs one export.
type exporter struct {
	r           Reader
	spec        exportSpec
	callTimeout time.Duration
	// emit takes a chunk of output; an error stops the export.
	emit func([]byte) error

	buf      []byte
	enc      listEncoder
	devText  []byte // `{"device":"<id>",` (ndjson) or `<id>,` (csv)
	ts       []byte
	rbuf     *buckets.ReadBuffer
	lastEmit time.Time
	n        int64
	pos      exportPos
	more     bool // stopped at Limit with readings left
}

// errExportLimit stops an export that delivered Limit readings and
// found another.
var errExportLimit = errors.New("export limit reached")

// run streams the export. With a limit that stops it early, more is
// set and pos is where the next export resumes.
func (x *exporter) run(ctx context.Context) error {
	x.rbuf = getReadBuffer()
	defer putReadBuffer(x.rbuf)
	pb := getBuf()
	defer putBuf(pb)
	x.buf = (*pb)[:0]
	defer func() { *pb = x.buf[:0] }()
	if x.spec.CSV {
		x.buf = append(x.buf, csvHeader...)
	}
	x.lastEmit = time.Now()
	err := x.devices(ctx)
	if errors.Is(err, errExportLimit) {
		x.more, err = true, nil
	}
	if err != nil {
		return err
	}
	return x.flush()
}

// devices streams every device the spec selects.
func (x *exporter) devices(ctx context.Context) error {
	var after buckets.DeviceID
	if a := x.spec.After; a != nil {
		after = a.Device
		if x.spec.Visible == nil || x.spec.Visible(a.Device) {
			last := a.Last
			if err := x.device(ctx, a.Device, &last); err != nil {
				return err
			}
		}
	}
	for {
		q := buckets.DeviceQuery{Prefix: x.spec.Prefix, After: after, Limit: exportDevicePage,
			Match: x.spec.Match, Visible: x.spec.Visible}
		cctx, cancel := context.WithTimeout(ctx, x.callTimeout)
		devs, more, err := x.r.Devices(cctx, q)
		cancel()
		if err != nil {
			return readerError(err, "export: list devices after %q", after)
		}
		for i := range devs {
			if err := x.device(ctx, devs[i].Device, nil); err != nil {
				return err
			}
		}
		if !more || len(devs) == 0 {
			return nil
		}
		after = devs[len(devs)-1].Device
	}
}

// device streams the readings of dev, behind after when set.
func (x *exporter) device(ctx context.Context, dev buckets.DeviceID, after *buckets.Ticks) error {
	if x.spec.CSV {
		x.devText = append(append(x.devText[:0], dev...), ',')
	} else {
		x.devText = append(appendString(append(x.devText[:0], `{"device":`...), string(dev)), ',')
	}
	q := buckets.RangeQuery{Device: dev, From: x.spec.From, To: x.spec.To, Order: buckets.Asc, Limit: exportPage, After: after}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		x.rbuf.Reset()
		cctx, cancel := context.WithTimeout(ctx, x.callTimeout)
		var page buckets.Page
		var err error
		if br, ok := x.r.(bufferedReader); ok {
			page, err = br.RangeIn(cctx, q, x.rbuf)
		} else {
			page, err = x.r.Range(cctx, q)
		}
		cancel()
		if errors.Is(err, buckets.ErrNotFound) {
			return nil // gone since it was listed
		}
		if err != nil {
			return readerError(err, "export: range %s", dev)
		}
		for i := range page.Readings {
			if x.spec.Limit > 0 && x.n == x.spec.Limit {
				return errExportLimit
			}
			r := &page.Readings[i]
			if x.spec.CSV {
				x.appendCSV(r)
			} else {
				x.appendNDJSON(r)
			}
			x.n++
			x.pos = exportPos{Device: dev, Last: r.Ticks}
			if len(x.buf) >= streamChunk {
				if err := x.flush(); err != nil {
					return err
				}
			}
		}
		if len(x.buf) > 0 && time.Since(x.lastEmit) >= exportFlushEvery {
			if err := x.flush(); err != nil {
				return err
			}
		}
		if !page.More || len(page.Readings) == 0 {
			return nil
		}
		last := page.Readings[len(page.Readings)-1].Ticks
		q.After = &last
	}
}

// flush hands on what the buffer holds.
func (x *exporter) flush() error {
	x.lastEmit = time.Now()
	if len(x.buf) == 0 {
		return nil
	}
	err := x.emit(x.buf)
	x.buf = x.buf[:0]
	return err
}

// appendNDJSON appends r as one line: the range API's reading with
// "device" first.
func (x *exporter) appendNDJSON(r *buckets.Reading) {
	x.buf = append(x.buf, x.devText...)
	mark := len(x.buf)
	x.buf = x.enc.appendReading(x.buf, r, nil)
	// Drop the reading's opening brace: devText opened the object.
	x.buf = append(x.buf[:mark], x.buf[mark+1:]...)
	x.buf = append(x.buf, '\n')
}

// appendCSV appends one row per value of r.
func (x *exporter) appendCSV(r *buckets.Reading) {
	x.ts = appendTicksTime(x.ts[:0], r.Ticks)
	ts := x.ts[1 : len(x.ts)-1] // without the JSON quotes
	for _, f := range sortedFields(r.Values) {
		b := append(x.buf, x.devText...)
		b = append(b, ts...)
		b = append(b, ',')
		b = append(b, f.Name...)
		b = append(b, ',')
		switch f.Value.Kind {
		case buckets.KindFloat:
			b = appendFloat(b, f.Value.AsFloat())
		case buckets.KindInt:
			b = strconv.AppendInt(b, f.Value.AsInt(), 10)
		case buckets.KindBool:
			b = strconv.AppendBool(b, f.Value.AsBool())
		default:
			b = appendCSVField(b, f.Value.AsString())
		}
		b = append(b, ',')
		b = append(b, f.Value.Kind.String()...)
		x.buf = append(b, '\n')
	}
}

// appendCSVField appends s as an RFC 4180 field: quoted, with quotes
// doubled, when it holds a comma, a quote, a line break or leading
// space, or is empty (so an empty string differs from a missing one).
func appendCSVField(dst []byte, s string) []byte {
	quote := s == "" || s[0] == ' ' || s[0] == '\t'
	for i := 0; i < len(s) && !quote; i++ {
		switch s[i] {
		case ',', '"', '\r', '\n':
			quote = true
		}
	}
	if !quote {
		return append(dst, s...)
	}
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' {
			dst = append(dst, '"')
		}
		dst = append(dst, s[i])
	}
	return append(dst, '"')
}

// ExportOptions selects what Export writes.
type ExportOptions struct {
	// Match is a Prometheus selector over device attributes and the
	// label device; empty: every device.
	Match string
	// Prefix keeps devices whose ID starts with it.
	Prefix string
	// From (inclusive) and To (exclusive) bound the readings; To 0
	// means no bound.
	From, To buckets.Ticks
	// Format is FormatNDJSON (default) or FormatCSV.
	Format string
	// CallTimeout bounds each call to the reader (default
	// DefaultQueryTimeout).
	CallTimeout time.Duration
}

// Export writes the readings o selects, read from r, to w in the
// format of GET /v1/export, and returns how many it wrote. It is what
// `telemetryd export` runs against a stopped data dir; progress, when
// set, is called with the running count after each chunk.
func Export(ctx context.Context, r Reader, o ExportOptions, w io.Writer, progress func(readings int64)) (int64, error) {
	format := o.Format
	if format == "" {
		format = FormatNDJSON
	}
	if _, ok := exportFormat(format); !ok {
		return 0, fmt.Errorf("export: format %q is not %s or %s", format, FormatNDJSON, FormatCSV)
	}
	ms, err := parseMatch(o.Match)
	if err != nil {
		return 0, fmt.Errorf("export: %w", err)
	}
	if err := validPrefix(o.Prefix); err != nil {
		return 0, fmt.Errorf("export: %w", err)
	}
	to := o.To
	if to == 0 {
		to = buckets.MaxTicks
	}
	if o.From < 0 || o.From >= to || !to.Valid() {
		return 0, fmt.Errorf("export: from %s is not before to %s", o.From.FormatTime(), to.FormatTime())
	}
	x := &exporter{r: r, callTimeout: o.CallTimeout,
		spec: exportSpec{Prefix: o.Prefix, Match: ms, From: o.From, To: to, CSV: format == FormatCSV}}
	if x.callTimeout <= 0 {
		x.callTimeout = DefaultQueryTimeout
	}
	x.emit = func(b []byte) error {
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("export: write: %w", err)
		}
		if progress != nil {
			progress(x.n)
		}
		return nil
	}
	err = x.run(ctx)
	return x.n, err
}
