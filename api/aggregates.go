package api

import (
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// Aggregator answers aggregate queries (api/README.md); the store
// implements it. Buckets are aligned to multiples of q.Interval since
// the Unix epoch, From inclusive, To exclusive, oldest first, at most
// q.Limit of them, resuming behind *q.After.
type Aggregator interface {
	Aggregate(ctx context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error)
}

// Limits of the aggregates endpoint.
const (
	maxAggregateBuckets = 10000
	minAggregateStep    = time.Second
	// maxAggregateStep is the widest bucket: a leap year.
	maxAggregateStep       = 366 * 24 * time.Hour
	defaultAggregateStep   = time.Minute
	cursorKindAggregates   = 'a'
	defaultAggregateWindow = 24 * time.Hour
)

// aggFn is one aggregation function of the fn parameter; the bit order
// is also the order of the keys in a bucket's value object.
type aggFn uint8

const (
	fnCount aggFn = 1 << iota
	fnSum
	fnMin
	fnMax
	fnAvg
	fnFirst
	fnLast
	fnAll = fnCount | fnSum | fnMin | fnMax | fnAvg | fnFirst | fnLast
	// fnDefault is count,min,max,avg.
	fnDefault = fnCount | fnMin | fnMax | fnAvg
)

// aggFnName names one function.
type aggFnName struct {
	fn   aggFn
	name string
}

// aggFnNames lists the functions in output order.
var aggFnNames = []aggFnName{
	{fnCount, "count"}, {fnSum, "sum"}, {fnMin, "min"}, {fnMax, "max"},
	{fnAvg, "avg"}, {fnFirst, "first"}, {fnLast, "last"},
}

// aggregateCursor is the state of a paged aggregate query: the whole
// resolved query plus the start of the last bucket returned.
type aggregateCursor struct {
	Device   buckets.DeviceID
	From, To buckets.Ticks
	Interval buckets.Ticks
	Fns      aggFn
	Fields   []string
	Last     buckets.Ticks
}

// handleAggregates serves GET /v1/devices/{device}/aggregates:
// per-bucket count, sum, min, max, avg, first and last of a device's
// numeric values, paged past limit buckets with a cursor.
func (s *Server) handleAggregates(c echo.Context) error {
	if s.aggregator == nil {
		return &apiError{http.StatusNotImplemented, codeNotImplemented, "aggregates: not served by this instance"}
	}
	dev, err := deviceParam(c)
	if err != nil {
		return err
	}
	limit, err := limitParam(c, maxAggregateBuckets, maxAggregateBuckets)
	if err != nil {
		return err
	}
	ac, after, err := s.aggregateQuery(c, dev)
	if err != nil {
		return err
	}
	// A page of buckets is held, and encoded in chunks: it takes room in
	// the response budget by its cells (buckets times value names, the
	// names of the device's latest reading when fields are not given),
	// and holds fewer buckets when that room is not there.
	width := int64(len(ac.Fields))
	if width == 0 {
		width = s.deviceWidth(c.Request().Context(), dev)
	}
	per := width * aggCellBytes
	res, err := s.reserveBytes(c, int64(limit)*per)
	if err != nil {
		return err
	}
	defer res.release()
	limit = int(min(int64(limit), max(res.n/per, 1)))
	q := buckets.AggregateQuery{Device: dev, From: ac.From, To: ac.To, Interval: ac.Interval,
		Fields: ac.Fields, Limit: limit, After: after}
	page, err := s.aggregator.Aggregate(c.Request().Context(), q)
	if errors.Is(err, buckets.ErrNotFound) {
		return unknownDevice(dev)
	}
	if err != nil {
		return readerError(err, "aggregate %s [%s, %s) by %s", dev, ac.From.FormatTime(), ac.To.FormatTime(), ac.Interval)
	}
	var cells int64
	for i := range page.Buckets {
		cells += int64(max(len(page.Buckets[i].Values), 1))
	}
	if need := cells * aggCellBytes; need < res.n {
		res.shrinkTo(need)
	} else if !res.growTo(need) {
		// Wider than its latest reading: the page is refused rather
		// than encoded past the budget.
		c.Response().Header().Set("Retry-After", strconv.Itoa(budgetRetryAfter))
		return &apiError{http.StatusServiceUnavailable, codeUnavailable,
			"query responses: the memory budget for responses in flight cannot hold this page; retry later or ask for fewer fields or buckets (limit)"}
	}
	next := ""
	if page.More && len(page.Buckets) > 0 {
		ac.Last = page.Buckets[len(page.Buckets)-1].Start
		next = s.encodeAggregateCursor(ac)
	}
	return s.sendAggregates(c, dev, ac, page.Buckets, next)
}

// aggCellBytes is what one value of one bucket is reckoned to take in
// flight: its summary and its share of the encoding.
const aggCellBytes = 128

// deviceWidth is the number of value names of dev's latest reading (at
// least 1), which an aggregates page without fields is sized by.
func (s *Server) deviceWidth(ctx context.Context, dev buckets.DeviceID) int64 {
	rs, err := s.reader.Latest(ctx, dev, 1)
	if err != nil || len(rs) == 0 {
		return 1
	}
	return int64(max(len(rs[0].Values), 1))
}

// sendAggregates writes an aggregates page as appendAggregates does: at
// once when it fits one chunk, else streamed in chunks, each of which
// the client must take within the stall timeout; it stops when the
// client goes away.
func (s *Server) sendAggregates(c echo.Context, dev buckets.DeviceID, ac aggregateCursor, bs []buckets.AggregateBucket, next string) error {
	buf := getBuf()
	defer putBuf(buf)
	b := appendAggregatesHead((*buf)[:0], dev, ac)
	var w *chunkWriter
	for i := range bs {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendAggregateBucket(b, &bs[i], ac.Fns)
		if len(b) >= streamChunk {
			if c.Request().Context().Err() != nil {
				*buf = b[:0]
				return nil // the client is gone; nothing more to say
			}
			if w == nil {
				w = s.startStream(c)
			}
			if err := w.write(b); err != nil {
				*buf = b[:0]
				return nil
			}
			b = b[:0]
		}
	}
	b = withWarnings(c.Request().Context(), appendAggregatesTail(b, next))
	*buf = b
	if w == nil {
		writeJSON(c, http.StatusOK, b)
		return nil
	}
	_ = w.write(b)
	return nil
}

// aggregateQuery resolves from, to, interval, fn and fields. With a
// cursor, the cursor's values hold and explicit parameters must agree.
func (s *Server) aggregateQuery(c echo.Context, dev buckets.DeviceID) (aggregateCursor, *buckets.Ticks, error) {
	from, hasFrom, err := timeParam(c, "from")
	if err != nil {
		return aggregateCursor{}, nil, err
	}
	to, hasTo, err := timeParam(c, "to")
	if err != nil {
		return aggregateCursor{}, nil, err
	}
	interval, hasInterval, err := intervalParam(c.QueryParam("interval"))
	if err != nil {
		return aggregateCursor{}, nil, err
	}
	fns, hasFns, err := fnParam(c.QueryParam("fn"))
	if err != nil {
		return aggregateCursor{}, nil, err
	}
	fields, err := fieldsParam(c)
	if err != nil {
		return aggregateCursor{}, nil, err
	}
	if hasFrom && hasTo && from >= to {
		return aggregateCursor{}, nil, invalidArg("from", "%s is not before to %s", from.FormatTime(), to.FormatTime())
	}
	if cur := c.QueryParam("cursor"); cur != "" {
		ac, err := s.decodeAggregateCursor(cur)
		if err != nil {
			return aggregateCursor{}, nil, err
		}
		switch {
		case ac.Device != dev:
			return aggregateCursor{}, nil, invalidArg("cursor", "belongs to device %q, not %q", ac.Device, dev)
		case hasFrom && from != ac.From, hasTo && to != ac.To, hasInterval && interval != ac.Interval,
			hasFns && fns != ac.Fns, fields != nil && !slices.Equal(fields, ac.Fields):
			return aggregateCursor{}, nil, invalidArg("cursor", "belongs to another query; repeat the first page's from, to, interval, fn and fields, or leave them out")
		}
		last := ac.Last
		return ac, &last, nil
	}
	if !hasTo {
		if to, err = s.defaultTo(); err != nil {
			return aggregateCursor{}, nil, err
		}
	}
	if !hasFrom {
		from = max(to-buckets.Ticks(defaultAggregateWindow/100), 0)
	}
	if from >= to {
		return aggregateCursor{}, nil, invalidArg("from", "%s is not before to %s", from.FormatTime(), to.FormatTime())
	}
	return aggregateCursor{Device: dev, From: from, To: to, Interval: interval, Fns: fns, Fields: fields}, nil, nil
}

// intervalParam parses interval: a Go duration ("90s", "1h30m") or a
// whole number of days ("7d"), from 1s to 366d, a multiple of 100 ns.
// Absent, it is one minute.
func intervalParam(s string) (buckets.Ticks, bool, error) {
	if s == "" {
		return buckets.Ticks(defaultAggregateStep / 100), false, nil
	}
	d, err := parseInterval(s)
	if err != nil {
		return 0, false, invalidArg("interval", "%s", err.Error())
	}
	return buckets.Ticks(d / 100), true, nil
}

// parseInterval parses a bucket width: a Go duration ("90s", "1h30m")
// or a whole number of days ("7d"), from 1s to 366d and a multiple of
// 100 ns (one tick).
func parseInterval(s string) (time.Duration, error) {
	var d time.Duration
	if n, ok := strings.CutSuffix(s, "d"); ok && n != "" && isDigits(n) {
		days, err := strconv.Atoi(n)
		if err != nil || days > int(maxAggregateStep/(24*time.Hour)) {
			return 0, errors.New("must be at most 366d, got " + quoted(s))
		}
		d = time.Duration(days) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, errors.New("cannot parse " + quoted(s) + ` as a duration ("30s", "5m", "1h", "7d")`)
		}
	}
	switch {
	case d < minAggregateStep:
		return 0, errors.New("must be at least 1s, got " + quoted(s))
	case d > maxAggregateStep:
		return 0, errors.New("must be at most 366d, got " + quoted(s))
	case d%100 != 0:
		return 0, errors.New("must be a multiple of 100ns, got " + quoted(s))
	}
	return d, nil
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// fnParam parses fn=count,min: any of count, sum, min, max, avg, first,
// last; absent means count,min,max,avg.
func fnParam(s string) (aggFn, bool, error) {
	if s == "" {
		return fnDefault, false, nil
	}
	var fns aggFn
	for name := range strings.SplitSeq(s, ",") {
		i := slices.IndexFunc(aggFnNames, func(f aggFnName) bool { return f.name == name })
		if i < 0 {
			return 0, false, invalidArg("fn", "%s is not one of count, sum, min, max, avg, first, last", quoted(name))
		}
		fns |= aggFnNames[i].fn
	}
	return fns, true, nil
}

// appendAggregates appends the Aggregates response,
// {"device","interval","buckets":[{"start","values":{name:{fn:...}}}],"next"},
// byte for byte as encoding/json writes it (encode_test.go), about 4
// times faster (BENCHMARKS.md).
func appendAggregates(dst []byte, dev buckets.DeviceID, ac aggregateCursor, bs []buckets.AggregateBucket, next string) []byte {
	dst = appendAggregatesHead(dst, dev, ac)
	for i := range bs {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendAggregateBucket(dst, &bs[i], ac.Fns)
	}
	return appendAggregatesTail(dst, next)
}

// appendAggregatesHead appends the response up to its first bucket.
func appendAggregatesHead(dst []byte, dev buckets.DeviceID, ac aggregateCursor) []byte {
	dst = append(dst, `{"device":`...)
	dst = appendString(dst, string(dev))
	dst = append(dst, `,"interval":`...)
	dst = appendString(dst, (time.Duration(ac.Interval) * 100).String())
	return append(dst, `,"buckets":[`...)
}

// appendAggregateBucket appends one bucket.
func appendAggregateBucket(dst []byte, b *buckets.AggregateBucket, fns aggFn) []byte {
	dst = append(dst, `{"start":`...)
	dst = appendTicksTime(dst, b.Start)
	dst = append(dst, `,"values":{`...)
	for j, v := range b.Values {
		if j > 0 {
			dst = append(dst, ',')
		}
		dst = appendString(dst, v.Name)
		dst = append(dst, ':')
		dst = appendSummary(dst, &v.Summary, fns)
	}
	return append(dst, "}}"...)
}

// appendAggregatesTail appends the response after its last bucket.
func appendAggregatesTail(dst []byte, next string) []byte {
	dst = append(dst, ']')
	dst = appendNext(dst, next)
	return append(dst, "}\n"...)
}

// appendSummary appends the selected functions of sm as an object.
func appendSummary(dst []byte, sm *buckets.Summary, fns aggFn) []byte {
	dst = append(dst, '{')
	first := true
	for _, f := range aggFnNames {
		if fns&f.fn == 0 {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, '"')
		dst = append(dst, f.name...)
		dst = append(dst, `":`...)
		switch f.fn {
		case fnCount:
			dst = strconv.AppendInt(dst, sm.Count, 10)
		case fnSum:
			dst = appendFloat(dst, sm.Sum)
		case fnMin:
			dst = appendFloat(dst, sm.Min)
		case fnMax:
			dst = appendFloat(dst, sm.Max)
		case fnAvg:
			dst = appendFloat(dst, sm.Avg())
		case fnFirst:
			dst = appendFloat(dst, sm.First)
		case fnLast:
			dst = appendFloat(dst, sm.Last)
		}
	}
	return append(dst, '}')
}

// encodeAggregateCursor returns the cursor string of ac (see cursor.go
// for the envelope).
func (s *Server) encodeAggregateCursor(ac aggregateCursor) string {
	b := make([]byte, 0, 64+len(ac.Device)+16*len(ac.Fields))
	b = append(b, cursorVersion, cursorKindAggregates)
	b = appendBytes(b, string(ac.Device))
	b = binary.BigEndian.AppendUint64(b, uint64(ac.From))
	b = binary.BigEndian.AppendUint64(b, uint64(ac.To))
	b = binary.BigEndian.AppendUint64(b, uint64(ac.Interval))
	b = append(b, byte(ac.Fns))
	b = binary.AppendUvarint(b, uint64(len(ac.Fields)))
	for _, f := range ac.Fields {
		b = appendBytes(b, f)
	}
	b = binary.BigEndian.AppendUint64(b, uint64(ac.Last))
	return s.cursors.seal(b)
}

// decodeAggregateCursor checks and decodes an aggregates cursor; every
// field is validated even when the MAC holds.
func (s *Server) decodeAggregateCursor(str string) (aggregateCursor, error) {
	p, err := s.cursors.open(str, cursorKindAggregates)
	if err != nil {
		return aggregateCursor{}, err
	}
	r := newCursorReader(p)
	var ac aggregateCursor
	ac.Device = buckets.DeviceID(r.str())
	ac.From = buckets.Ticks(r.u64())
	ac.To = buckets.Ticks(r.u64())
	ac.Interval = buckets.Ticks(r.u64())
	ac.Fns = aggFn(r.Byte())
	n := r.Uvarint()
	if n > buckets.MaxValues {
		r.Fail()
	}
	for i := uint64(0); i < n && !r.Failed(); i++ {
		ac.Fields = append(ac.Fields, r.str())
	}
	ac.Last = buckets.Ticks(r.u64())
	iv := time.Duration(ac.Interval) * 100
	if r.Failed() || r.Len() != 0 || ac.Device.Validate() != nil ||
		!ac.From.Valid() || !ac.To.Valid() || ac.From >= ac.To ||
		iv < minAggregateStep || iv > maxAggregateStep ||
		ac.Fns == 0 || ac.Fns&^fnAll != 0 ||
		ac.Last < ac.From-ac.Interval || ac.Last >= ac.To || !validFieldList(ac.Fields) {
		return aggregateCursor{}, invalidArg("cursor", "malformed; pass the next value of the previous page unchanged")
	}
	return ac, nil
}
