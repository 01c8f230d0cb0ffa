package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// The response bodies of the API, one Go type each. They are encoded
// with encoding/json, except ReadingList, Reading and Aggregates: those
// answer the query paths (latest-N, range, point, and the dashboards'
// aggregates) and are written by appenders (encode.go, aggregates.go)
// that produce exactly the bytes encoding/json would produce for these
// types (tests compare them), 4-9 times faster
// (api/README.md, "Hand-written JSON: kept only where it pays").

// Reading is one reading (api/README.md). Values holds float64, int64, bool
// or string values by name.
type Reading struct {
	TS           time.Time      `json:"ts"`
	PartitionKey string         `json:"partitionKey"`
	RowKey       string         `json:"rowKey"`
	Values       map[string]any `json:"values"`
}

// ReadingList is the answer of the latest-N and range queries. Next is
// the cursor of the following page, absent when nothing remains.
type ReadingList struct {
	Device   string    `json:"device"`
	Readings []Reading `json:"readings"`
	Next     string    `json:"next,omitempty"`
}

// Device is one entry of GET /v1/devices and the answer of GET
// /v1/devices/{device}. A device known only by its attributes (no
// reading yet) has the zero time, 0001-01-01T00:00:00Z, as first and
// last seen.
type Device struct {
	Device     string            `json:"device"`
	Attributes map[string]string `json:"attributes"`
	FirstSeen  time.Time         `json:"firstSeen"`
	LastSeen   time.Time         `json:"lastSeen"`
	Latest     map[string]any    `json:"latest"`
}

// AttributeSet is the answer of PUT and PATCH
// /v1/devices/{device}/attributes: the device's attributes after the
// change.
type AttributeSet struct {
	Device     string            `json:"device"`
	Attributes map[string]string `json:"attributes"`
}

// DeviceList is the answer of GET /v1/devices.
type DeviceList struct {
	Devices []Device `json:"devices"`
	Next    string   `json:"next,omitempty"`
}

// Table is one day table in GET /v1/tables. Readings is absent when
// the count is not known; ExpiresAt when the server has no retention
// policy.
type Table struct {
	Day       string     `json:"day"`
	SizeBytes int64      `json:"sizeBytes"`
	Readings  *int64     `json:"readings,omitempty"`
	ExpiresAt *time.Time `json:"expiresAt,omitempty"`
}

// TableList is the answer of GET /v1/tables.
type TableList struct {
	Tables []Table `json:"tables"`
}

// DroppedTable is one table dropped (or, on a dry run, to be dropped).
type DroppedTable struct {
	Day       string `json:"day"`
	SizeBytes int64  `json:"sizeBytes"`
	Readings  *int64 `json:"readings,omitempty"`
	Reason    string `json:"reason"`
}

// DropResult is the answer of DELETE /v1/tables/{day}.
type DropResult struct {
	Dropped []DroppedTable `json:"dropped"`
}

// RetentionRun is the answer of POST /v1/retention/run.
type RetentionRun struct {
	DryRun    bool           `json:"dryRun"`
	StartedAt time.Time      `json:"startedAt"`
	Cutoff    time.Time      `json:"cutoff"`
	Dropped   []DroppedTable `json:"dropped"`
	Kept      int            `json:"kept"`
	BytesNow  int64          `json:"bytesNow"`
}

// Status is the answer of /healthz and /readyz. A ready answer also
// says which durability mode runs and what an ack promises in it
// (Config.Durability).
type Status struct {
	Status     string `json:"status"`
	Durability string `json:"durability,omitempty"`
	Ack        string `json:"ack,omitempty"`
	// Streams names the readings streams consumed (one per partition).
	Streams []string `json:"streams,omitempty"`
}

// ErrorResponse is the body of every JSON error answer.
type ErrorResponse struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is the code and the message of an error; the message
// starts with the name of the parameter (or part of the request) at
// fault.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// valuesOf returns fields as a Values map, keeping only the names in
// proj when proj is not nil.
func valuesOf(fields []buckets.Field, proj []string) map[string]any {
	out := make(map[string]any, len(fields))
	for _, f := range fields {
		if proj == nil || containsSorted(proj, f.Name) {
			out[f.Name] = f.Value.Any()
		}
	}
	return out
}

func containsSorted(sorted []string, s string) bool {
	for _, x := range sorted {
		if x == s {
			return true
		}
	}
	return false
}

// readingOf is the response form of r.
func readingOf(r *buckets.Reading, proj []string) Reading {
	return Reading{TS: r.Ticks.Time(), PartitionKey: r.PartitionKey(), RowKey: r.RowKey(), Values: valuesOf(r.Values, proj)}
}

// readingListOf is the response form of a page of readings.
func readingListOf(dev buckets.DeviceID, rs []buckets.Reading, proj []string, next string) ReadingList {
	out := ReadingList{Device: string(dev), Readings: make([]Reading, len(rs)), Next: next}
	for i := range rs {
		out.Readings[i] = readingOf(&rs[i], proj)
	}
	return out
}

func deviceOf(d *buckets.DeviceInfo) Device {
	return Device{Device: string(d.Device), Attributes: d.Attributes.Map(), FirstSeen: d.FirstSeen.Time(),
		LastSeen: d.LastSeen.Time(), Latest: valuesOf(d.Latest, nil)}
}

// knownCount is a reading count for the JSON, nil when unknown (< 0).
func knownCount(n int64) *int64 {
	if n < 0 {
		return nil
	}
	return &n
}

func droppedOf(drops []buckets.TableDrop) []DroppedTable {
	out := make([]DroppedTable, len(drops))
	for i, d := range drops {
		out[i] = DroppedTable{Day: d.Day.String(), SizeBytes: d.SizeBytes, Readings: knownCount(d.Readings), Reason: d.Reason}
	}
	return out
}

// sendValue writes v as the whole JSON response with status, encoded
// by encoding/json (HTML characters are not escaped: the API serves
// JSON, never HTML).
func sendValue(c echo.Context, status int, v any) error {
	buf := getBuf()
	defer putBuf(buf)
	b := bytes.NewBuffer(*buf)
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encode %T: %w", v, err)
	}
	*buf = b.Bytes()
	writeJSON(c, status, *buf)
	return nil
}

// writeJSON writes b as the whole response. A failed write means the
// client went away; there is nobody left to tell.
func writeJSON(c echo.Context, status int, b []byte) {
	res := c.Response()
	res.Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	res.Header().Set("Content-Length", strconv.Itoa(len(b)))
	res.WriteHeader(status)
	if c.Request().Method != http.MethodHead {
		_, _ = res.Write(b)
	}
}

// Aggregates is the answer of GET /v1/devices/{device}/aggregates.
type Aggregates struct {
	Device   string            `json:"device"`
	Interval string            `json:"interval"`
	Buckets  []AggregateBucket `json:"buckets"`
	Next     string            `json:"next,omitempty"`
}

// AggregateBucket is one interval that held readings: its start and a
// summary per value name.
type AggregateBucket struct {
	Start  time.Time                   `json:"start"`
	Values map[string]AggregateSummary `json:"values"`
}

// AggregateSummary holds the functions the request asked for (fn);
// the others are absent.
type AggregateSummary struct {
	Count *int64   `json:"count,omitempty"`
	Sum   *float64 `json:"sum,omitempty"`
	Min   *float64 `json:"min,omitempty"`
	Max   *float64 `json:"max,omitempty"`
	Avg   *float64 `json:"avg,omitempty"`
	First *float64 `json:"first,omitempty"`
	Last  *float64 `json:"last,omitempty"`
}

// aggregatesOf is the response form of a page of aggregate buckets,
// keeping the functions in fns.
func aggregatesOf(dev buckets.DeviceID, interval buckets.Ticks, fns aggFn, bs []buckets.AggregateBucket, next string) Aggregates {
	out := Aggregates{Device: string(dev), Interval: (time.Duration(interval) * 100).String(),
		Buckets: make([]AggregateBucket, len(bs)), Next: next}
	for i := range bs {
		values := make(map[string]AggregateSummary, len(bs[i].Values))
		for _, v := range bs[i].Values {
			values[v.Name] = summaryOf(&v.Summary, fns)
		}
		out.Buckets[i] = AggregateBucket{Start: bs[i].Start.Time(), Values: values}
	}
	return out
}

// summaryOf keeps the functions of sm selected by fns; the numbers
// share one allocation.
func summaryOf(sm *buckets.Summary, fns aggFn) AggregateSummary {
	var out AggregateSummary
	nums := new([7]float64)
	pick := func(f aggFn, i int, v float64) *float64 {
		if fns&f == 0 {
			return nil
		}
		nums[i] = v
		return &nums[i]
	}
	if fns&fnCount != 0 {
		n := sm.Count
		out.Count = &n
	}
	out.Sum = pick(fnSum, 0, sm.Sum)
	out.Min = pick(fnMin, 1, sm.Min)
	out.Max = pick(fnMax, 2, sm.Max)
	out.Avg = pick(fnAvg, 3, sm.Avg())
	out.First = pick(fnFirst, 4, sm.First)
	out.Last = pick(fnLast, 5, sm.Last)
	return out
}
