package api

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// defaultRangeSpan is how far back a range query reaches when from is
// not given.
const defaultRangeSpan = 24 * time.Hour

// handleLatest serves GET /v1/devices/{device}/readings/latest: the
// newest readings of a device, newest first.
func (s *Server) handleLatest(c echo.Context) error {
	dev, err := deviceParam(c)
	if err != nil {
		return err
	}
	limit, err := limitParam(c, defaultLatestLimit, maxLatestLimit)
	if err != nil {
		return err
	}
	fields, err := fieldsParam(c)
	if err != nil {
		return err
	}
	res, err := s.reserve(c, limit)
	if err != nil {
		return err
	}
	defer res.release()
	buf := getReadBuffer()
	defer putReadBuffer(buf)
	var rs []buckets.Reading
	if br, ok := s.reader.(bufferedReader); ok {
		rs, err = br.LatestIn(c.Request().Context(), dev, limit, buf)
	} else {
		rs, err = s.reader.Latest(c.Request().Context(), dev, limit)
	}
	if errors.Is(err, buckets.ErrNotFound) {
		return unknownDevice(dev)
	}
	if err != nil {
		return readerError(err, "latest %d of %s", limit, dev)
	}
	res.trim(len(rs))
	return s.sendReadingList(c, dev, rs, fields, "")
}

// bufferedReader is a Reader that can build the answers of Latest and
// Range in a buckets.ReadBuffer (the store does): the handlers write
// the answer out and hand the buffer to the next request, so a busy
// query path makes little garbage for the collector.
type bufferedReader interface {
	LatestIn(ctx context.Context, dev buckets.DeviceID, n int, buf *buckets.ReadBuffer) ([]buckets.Reading, error)
	RangeIn(ctx context.Context, q buckets.RangeQuery, buf *buckets.ReadBuffer) (buckets.Page, error)
}

// maxPooledReadBuffer is the largest read buffer kept for the next
// request (a 10,000-reading page of three values takes about 2 MB).
const maxPooledReadBuffer = 4 << 20

var readBuffers = sync.Pool{New: func() any { return new(buckets.ReadBuffer) }}

func getReadBuffer() *buckets.ReadBuffer { return readBuffers.Get().(*buckets.ReadBuffer) }

// putReadBuffer clears buf and keeps it for the next request, unless
// it grew past maxPooledReadBuffer. Nothing may use the readings of
// the answer built in it afterwards.
func putReadBuffer(buf *buckets.ReadBuffer) {
	if buf.Bytes() > maxPooledReadBuffer {
		return
	}
	buf.Reset()
	readBuffers.Put(buf)
}

// unknownDevice answers a reader that does not know the device at all
// (a reader may also just return no readings).
func unknownDevice(dev buckets.DeviceID) error {
	return notFound("device", "%q is not known", dev)
}

// handlePoint serves GET /v1/devices/{device}/readings/{ts}: the
// reading at exactly ts, else 404.
func (s *Server) handlePoint(c echo.Context) error {
	dev, err := deviceParam(c)
	if err != nil {
		return err
	}
	raw, err := pathParam(c, "ts")
	if err != nil {
		return err
	}
	k, err := parseTime("ts", raw)
	if err != nil {
		return err
	}
	fields, err := fieldsParam(c)
	if err != nil {
		return err
	}
	r, err := s.reader.Get(c.Request().Context(), dev, k)
	if errors.Is(err, buckets.ErrNotFound) {
		return notFound("ts", "device %q has no reading at %s", dev, k.FormatTime())
	}
	if err != nil {
		return readerError(err, "get %s at %s", dev, k.FormatTime())
	}
	return sendAppended(c, func(b []byte) []byte {
		b = appendReading(b, &r, fields)
		return append(b, '\n')
	})
}

// handleRange serves GET /v1/devices/{device}/readings: readings with
// from <= ts < to, paged with an opaque cursor.
func (s *Server) handleRange(c echo.Context) error {
	dev, err := deviceParam(c)
	if err != nil {
		return err
	}
	limit, err := limitParam(c, defaultRangeLimit, maxRangeLimit)
	if err != nil {
		return err
	}
	rc, after, err := s.rangeQuery(c, dev)
	if err != nil {
		return err
	}
	q := buckets.RangeQuery{Device: dev, From: rc.From, To: rc.To, Order: rc.Order, Limit: limit, After: after}
	res, err := s.reserve(c, limit)
	if err != nil {
		return err
	}
	defer res.release()
	buf := getReadBuffer()
	defer putReadBuffer(buf)
	var page buckets.Page
	if br, ok := s.reader.(bufferedReader); ok {
		page, err = br.RangeIn(c.Request().Context(), q, buf)
	} else {
		page, err = s.reader.Range(c.Request().Context(), q)
	}
	if errors.Is(err, buckets.ErrNotFound) {
		return unknownDevice(dev)
	}
	if err != nil {
		return readerError(err, "range %s [%s, %s)", dev, rc.From.FormatTime(), rc.To.FormatTime())
	}
	next := ""
	if page.More && len(page.Readings) > 0 {
		rc.Last = page.Readings[len(page.Readings)-1].Ticks
		next = s.cursors.encodeRange(rc)
	}
	res.trim(len(page.Readings))
	return s.sendReadingList(c, dev, page.Readings, rc.Fields, next)
}

// rangeQuery resolves from, to, order and fields of a range request.
// With a cursor, the cursor's values hold and any explicit parameter
// must agree with them; without one, defaults come from the clock.
func (s *Server) rangeQuery(c echo.Context, dev buckets.DeviceID) (rangeCursor, *buckets.Ticks, error) {
	from, hasFrom, err := timeParam(c, "from")
	if err != nil {
		return rangeCursor{}, nil, err
	}
	to, hasTo, err := timeParam(c, "to")
	if err != nil {
		return rangeCursor{}, nil, err
	}
	order, hasOrder, err := orderParam(c)
	if err != nil {
		return rangeCursor{}, nil, err
	}
	fields, err := fieldsParam(c)
	if err != nil {
		return rangeCursor{}, nil, err
	}
	if hasFrom && hasTo && from >= to {
		return rangeCursor{}, nil, invalidArg("from", "%s is not before to %s", from.FormatTime(), to.FormatTime())
	}
	if cur := c.QueryParam("cursor"); cur != "" {
		rc, err := s.cursors.decodeRange(cur)
		if err != nil {
			return rangeCursor{}, nil, err
		}
		switch {
		case rc.Device != dev:
			return rangeCursor{}, nil, invalidArg("cursor", "belongs to device %q, not %q", rc.Device, dev)
		case hasFrom && from != rc.From, hasTo && to != rc.To, hasOrder && order != rc.Order,
			fields != nil && !slices.Equal(fields, rc.Fields):
			return rangeCursor{}, nil, invalidArg("cursor", "belongs to another query; repeat the first page's from, to, order and fields, or leave them out")
		}
		last := rc.Last
		return rc, &last, nil
	}
	if !hasTo {
		to, err = s.defaultTo()
		if err != nil {
			return rangeCursor{}, nil, err
		}
	}
	if !hasFrom {
		from = max(to-buckets.Ticks(defaultRangeSpan/100), 0)
	}
	if from >= to {
		return rangeCursor{}, nil, invalidArg("from", "%s is not before to %s", from.FormatTime(), to.FormatTime())
	}
	return rangeCursor{Device: dev, From: from, To: to, Order: order, Fields: fields}, nil, nil
}

// defaultTo is now + MaxFutureSkew, capped at the last representable
// instant.
func (s *Server) defaultTo() (buckets.Ticks, error) {
	t := s.now().Add(s.skew)
	k, err := buckets.TicksOf(t)
	if err != nil {
		return 0, fmt.Errorf("default to from clock %s: %w", t, err)
	}
	return k, nil
}
