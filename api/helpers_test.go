package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/bucketstest"
)

// fakeReader is an in-memory api.Reader that answers like the store
// (Range honours From, To, Order, Limit and After) and records every
// call.
type fakeReader struct {
	mu      sync.Mutex
	data    map[buckets.DeviceID][]buckets.Reading // ascending by ticks
	devices []buckets.DeviceInfo                   // sorted by device
	tables  []buckets.TableInfo
	err     error  // returned by every call when set
	panics  string // every call panics with this when set
	// gate, when set, holds every call until it is closed or the
	// request context ends; entered gets one token per held call.
	gate    chan struct{}
	entered chan struct{}

	latest  []int
	ranges  []buckets.RangeQuery
	gets    []buckets.Ticks
	devArgs []devicesArgs
	devQs   []buckets.DeviceQuery
	assigns []buckets.Assignment

	// attrs holds every attribute ever assigned, removed ones too, with
	// the time of the assignment that decided it (newest wins).
	attrs map[buckets.DeviceID]map[string]attrState
}

// attrState is one attribute of the fake: its value, or gone, as of at.
type attrState struct {
	value string
	at    buckets.Ticks
	gone  bool
}

type devicesArgs struct {
	prefix string
	after  buckets.DeviceID
	limit  int
}

func newFakeReader() *fakeReader {
	return &fakeReader{data: map[buckets.DeviceID][]buckets.Reading{}, attrs: map[buckets.DeviceID]map[string]attrState{}}
}

// add stores readings (any order) for their devices.
func (f *fakeReader) add(rs ...buckets.Reading) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range rs {
		f.data[r.Device] = append(f.data[r.Device], r)
		slices.SortFunc(f.data[r.Device], func(a, b buckets.Reading) int { return int(a.Ticks - b.Ticks) })
	}
}

// hold makes every call wait at the gate until it is closed (or its
// request context ends), announcing itself on entered, which holds up
// to n announcements.
func (f *fakeReader) hold(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.gate = make(chan struct{})
	f.entered = make(chan struct{}, n)
}

// enter runs the common part of every call: gate, panic, error.
func (f *fakeReader) enter(ctx context.Context) error {
	f.mu.Lock()
	gate, entered, err, p := f.gate, f.entered, f.err, f.panics
	f.mu.Unlock()
	if gate != nil {
		if entered != nil {
			entered <- struct{}{}
		}
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if p != "" {
		panic(p)
	}
	return err
}

func (f *fakeReader) Latest(ctx context.Context, dev buckets.DeviceID, n int) ([]buckets.Reading, error) {
	f.mu.Lock()
	f.latest = append(f.latest, n)
	f.mu.Unlock()
	if err := f.enter(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	rs := slices.Clone(f.data[dev])
	slices.Reverse(rs)
	return rs[:min(n, len(rs))], nil
}

func (f *fakeReader) Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	f.mu.Lock()
	rec := q
	if q.After != nil {
		a := *q.After
		rec.After = &a
	}
	f.ranges = append(f.ranges, rec)
	f.mu.Unlock()
	if err := f.enter(ctx); err != nil {
		return buckets.Page{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	rs := slices.Clone(f.data[q.Device])
	if q.Order == buckets.Desc {
		slices.Reverse(rs)
	}
	var page buckets.Page
	for _, r := range rs {
		if r.Ticks < q.From || r.Ticks >= q.To {
			continue
		}
		if q.After != nil && ((q.Order == buckets.Asc && r.Ticks <= *q.After) || (q.Order == buckets.Desc && r.Ticks >= *q.After)) {
			continue
		}
		if len(page.Readings) == q.Limit {
			page.More = true
			break
		}
		page.Readings = append(page.Readings, r)
	}
	return page, nil
}

func (f *fakeReader) Get(ctx context.Context, dev buckets.DeviceID, k buckets.Ticks) (buckets.Reading, error) {
	f.mu.Lock()
	f.gets = append(f.gets, k)
	f.mu.Unlock()
	if err := f.enter(ctx); err != nil {
		return buckets.Reading{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, r := range f.data[dev] {
		if r.Ticks == k {
			return r, nil
		}
	}
	return buckets.Reading{}, &wrapped{"reading " + string(dev) + " " + k.FormatTime(), buckets.ErrNotFound}
}

func (f *fakeReader) Devices(ctx context.Context, q buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	prefix, after, limit := q.Prefix, q.After, q.Limit
	f.mu.Lock()
	f.devArgs = append(f.devArgs, devicesArgs{prefix, after, limit})
	f.devQs = append(f.devQs, q)
	f.mu.Unlock()
	if err := f.enter(ctx); err != nil {
		return nil, false, err
	}
	if limit <= 0 {
		return nil, false, &wrapped{"limit " + strconv.Itoa(limit), buckets.ErrInvalidArgument}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []buckets.DeviceInfo
	for _, d := range f.devices {
		if !strings.HasPrefix(string(d.Device), prefix) || d.Device <= after || !f.selects(q, &d) {
			continue
		}
		if len(out) == limit {
			return out, true, nil
		}
		out = append(out, f.withAttributes(d))
	}
	return out, false, nil
}

// selects reports whether q keeps d, as the store decides: every
// matcher on its attributes (a missing one matches as ""; "device" is
// the ID), silence, visibility. f.mu is held.
func (f *fakeReader) selects(q buckets.DeviceQuery, d *buckets.DeviceInfo) bool {
	attrs := f.withAttributes(*d).Attributes
	for _, m := range q.Match {
		v, _ := attrs.Get(m.Name)
		if m.Name == "device" {
			v = string(d.Device)
		}
		if !m.Matches(v) {
			return false
		}
	}
	if q.SilentBefore != 0 && d.LastSeen >= q.SilentBefore {
		return false
	}
	return q.Visible == nil || q.Visible(d.Device)
}

// withAttributes returns d with its current attributes. f.mu is held.
func (f *fakeReader) withAttributes(d buckets.DeviceInfo) buckets.DeviceInfo {
	d.Attributes = nil
	for name, st := range f.attrs[d.Device] {
		if !st.gone {
			d.Attributes = append(d.Attributes, buckets.Attribute{Name: name, Value: st.value})
		}
	}
	slices.SortFunc(d.Attributes, func(a, b buckets.Attribute) int { return strings.Compare(a.Name, b.Name) })
	return d
}

func (f *fakeReader) Device(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceInfo, error) {
	if err := f.enter(ctx); err != nil {
		return buckets.DeviceInfo{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.devices {
		if d.Device == dev {
			return f.withAttributes(d), nil
		}
	}
	return buckets.DeviceInfo{}, &wrapped{"device " + string(dev), buckets.ErrNotFound}
}

// Assign applies assignments as the store does: per attribute the
// newest by At wins (removals and a PUT's replacement too), a device
// first known by its attributes gets a record, and a set that would
// exceed buckets.MaxAttributes is refused whole.
func (f *fakeReader) Assign(ctx context.Context, as []buckets.Assignment) error {
	f.mu.Lock()
	f.assigns = append(f.assigns, as...)
	f.mu.Unlock()
	if err := f.enter(ctx); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	next := map[buckets.DeviceID]map[string]attrState{}
	for _, a := range as {
		cur := next[a.Device]
		if cur == nil {
			cur = maps.Clone(f.attrs[a.Device])
			if cur == nil {
				cur = map[string]attrState{}
			}
			next[a.Device] = cur
		}
		apply := func(name string, st attrState) {
			if old, ok := cur[name]; !ok || old.at < st.at {
				cur[name] = st
			}
		}
		for _, x := range a.Set {
			if err := buckets.ValidateAttributeName(x.Name); err != nil {
				return err
			}
			if err := buckets.ValidateAttributeValue(x.Name, x.Value); err != nil {
				return err
			}
			apply(x.Name, attrState{value: x.Value, at: a.At})
		}
		for _, name := range a.Remove {
			apply(name, attrState{at: a.At, gone: true})
		}
		if a.Replace {
			for name := range cur {
				if _, ok := a.Set.Get(name); !ok {
					apply(name, attrState{at: a.At, gone: true})
				}
			}
		}
		n := 0
		for _, st := range cur {
			if !st.gone {
				n++
			}
		}
		if n > buckets.MaxAttributes {
			return buckets.Invalid(buckets.CodeTooManyAttributes, -1, "attributes", "%d attributes, at most %d are allowed", n, buckets.MaxAttributes)
		}
	}
	for dev, cur := range next {
		f.attrs[dev] = cur
		i, found := slices.BinarySearchFunc(f.devices, dev, func(d buckets.DeviceInfo, id buckets.DeviceID) int {
			return strings.Compare(string(d.Device), string(id))
		})
		if !found {
			f.devices = slices.Insert(f.devices, i, buckets.DeviceInfo{Device: dev})
		}
	}
	return nil
}

// AttributeNames and AttributeValues answer from the devices q selects.
func (f *fakeReader) AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error) {
	return f.attributeValues(ctx, "", q)
}

func (f *fakeReader) AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error) {
	return f.attributeValues(ctx, name, q)
}

func (f *fakeReader) attributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error) {
	if err := f.enter(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, d := range f.devices {
		if !strings.HasPrefix(string(d.Device), q.Prefix) || !f.selects(q, &d) {
			continue
		}
		for _, a := range f.withAttributes(d).Attributes {
			switch {
			case name == "":
				out = append(out, a.Name)
			case a.Name == name:
				out = append(out, a.Value)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// setAttributes gives a device of f.devices attributes at time 1.
func (f *fakeReader) setAttributes(dev buckets.DeviceID, kv ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := map[string]attrState{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = attrState{value: kv[i+1], at: 1}
	}
	f.attrs[dev] = m
}

func (f *fakeReader) Tables(ctx context.Context) ([]buckets.TableInfo, error) {
	if err := f.enter(ctx); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tables), nil
}

// calls returns copies of what the fake was asked.
func (f *fakeReader) rangeCalls() []buckets.RangeQuery {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ranges)
}

// wrapped is an error with a message that wraps a sentinel.
type wrapped struct {
	msg string
	err error
}

func (w *wrapped) Error() string { return w.msg + ": " + w.err.Error() }
func (w *wrapped) Unwrap() error { return w.err }

// fakeAdmin is an api.Admin that records its calls.
type fakeAdmin struct {
	mu      sync.Mutex
	tables  map[buckets.Day]buckets.TableDrop
	report  buckets.RetentionReport
	dropped []buckets.Day
	runs    []bool
	devices map[buckets.DeviceID]buckets.DeviceDelete // what DeleteDevice finds
	deleted []buckets.DeviceID
}

func (a *fakeAdmin) DropTable(_ context.Context, day buckets.Day) (buckets.TableDrop, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.tables[day]
	if !ok {
		return buckets.TableDrop{}, &wrapped{"table " + day.String(), buckets.ErrNotFound}
	}
	delete(a.tables, day)
	a.dropped = append(a.dropped, day)
	return d, nil
}

func (a *fakeAdmin) DeleteDevice(_ context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	d, ok := a.devices[dev]
	if !ok {
		return buckets.DeviceDelete{Device: dev, Readings: -1}, &wrapped{"device " + string(dev), buckets.ErrNotFound}
	}
	delete(a.devices, dev)
	a.deleted = append(a.deleted, dev)
	return d, nil
}

func (a *fakeAdmin) RunRetention(_ context.Context, dryRun bool) (buckets.RetentionReport, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.runs = append(a.runs, dryRun)
	r := a.report
	r.DryRun = dryRun
	return r, nil
}

// testNow is the fixed clock of every test server.
var testNow = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

// testEnv is a Server on an httptest server with fakes and in-memory
// telemetry.
type testEnv struct {
	srv     *api.Server
	url     string
	reader  *fakeReader
	admin   *fakeAdmin
	clock   *bucketstest.Clock
	metrics *sdkmetric.ManualReader
	spans   *tracetest.SpanRecorder
	logs    *bucketstest.SyncBuffer
}

// newTestEnv builds a test server; edit adjusts the Config first.
func newTestEnv(t testing.TB, edit ...func(*api.Config)) *testEnv {
	t.Helper()
	env := &testEnv{
		reader:  newFakeReader(),
		admin:   &fakeAdmin{tables: map[buckets.Day]buckets.TableDrop{}},
		clock:   bucketstest.NewClock(testNow),
		metrics: sdkmetric.NewManualReader(),
		spans:   tracetest.NewSpanRecorder(),
		logs:    &bucketstest.SyncBuffer{},
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(env.metrics))
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(env.spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	cfg := api.Config{
		Addr:           "127.0.0.1:0",
		Reader:         env.reader,
		Attributes:     env.reader,
		Admin:          env.admin,
		Logger:         slog.New(slog.NewTextHandler(env.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		TracerProvider: tp,
		MeterProvider:  mp,
		Now:            env.clock.Now,
		CursorKey:      []byte("test cursor key"),
	}
	for _, e := range edit {
		e(&cfg)
	}
	srv, err := api.New(cfg)
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	env.srv, env.url = srv, hs.URL
	return env
}

// response is a decoded HTTP response.
type response struct {
	status int
	header http.Header
	body   []byte
}

// json decodes the body into a map, keeping numbers as json.Number.
func (r response) json(t *testing.T) map[string]any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(r.body))
	d.UseNumber()
	var m map[string]any
	require.NoError(t, d.Decode(&m), "body: %s", r.body)
	return m
}

// do sends a request to the test server.
func (e *testEnv) do(t *testing.T, method, path string, header ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, e.url+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{res.StatusCode, res.Header, body}
}

func (e *testEnv) get(t *testing.T, path string) response {
	t.Helper()
	return e.do(t, http.MethodGet, path)
}

// requireError checks an error response: status, code and that the
// message starts with "<param>: ".
func requireError(t *testing.T, r response, status int, code, param string) string {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal(r.body, &body), "body: %s", r.body)
	assert.Equal(t, code, body.Error.Code)
	if param != "" {
		assert.True(t, strings.HasPrefix(body.Error.Message, param+": "), "message %q should start with %q", body.Error.Message, param+": ")
	}
	return body.Error.Message
}

// keys returns the sorted keys of m.
func keys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// mustTicks parses an RFC 3339 time into ticks.
func mustTicks(t testing.TB, s string) buckets.Ticks {
	t.Helper()
	k, err := buckets.ParseTime(s)
	require.NoError(t, err)
	return k
}

// reading builds a reading of dev at ts with a float value temp.
func reading(t testing.TB, dev string, k buckets.Ticks, temp float64) buckets.Reading {
	t.Helper()
	return buckets.Reading{Device: buckets.DeviceID(dev), Ticks: k, Values: []buckets.Field{{Name: "temp", Value: buckets.Float(temp)}}}
}

// q builds a query string.
func q(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		v.Add(kv[i], kv[i+1])
	}
	return "?" + v.Encode()
}
