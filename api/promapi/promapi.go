// Package promapi serves the subset of the Prometheus HTTP query API
// that Grafana's Prometheus data source uses (api/README.md): instant and
// range queries, series, label names and label values. PromQL is
// evaluated by the Prometheus engine itself (promql.Engine) over a
// storage.Queryable on the store: each numeric value of a device is
// the series {__name__="<value name>", device="<device>", <attributes>}
// (bool as 0/1, strings are not series), and every device that sent a
// reading has the series LastSeenName. Device, attribute and __name__
// matchers are pushed down, so temp{device="d1"} reads only d1's
// readings and temp{fleet="East"} only the East fleet's.
//
// Answers and errors use the Prometheus API's JSON envelope
// ({"status":"success","data":...} and {"status":"error","errorType":...,"error":...}).
package promapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"

	"github.com/telemetryd/telemetryd/buckets"
)

// Defaults applied by New to zero Config fields.
const (
	DefaultTimeout       = 30 * time.Second
	DefaultMaxSamples    = 10_000_000
	DefaultMaxSeries     = 100_000
	DefaultLookbackDelta = 5 * time.Minute
	// DefaultResultCacheBytes is Config.ResultCacheBytes' default.
	DefaultResultCacheBytes = 32 << 20
	// MaxPoints is the most points per series a range query may ask for
	// (as Prometheus: 11,000).
	MaxPoints = 11000
	// defaultPageSize is how many readings one store read returns.
	defaultPageSize = 4096
)

// Config configures an API. Only Source is required.
type Config struct {
	// Source is the store.
	Source Source
	// Visible, when set, returns the device filter of the request of
	// ctx (the token's device patterns; nil when it sees every device).
	// It is handed to the store with every device query, so hidden
	// devices, their series, attributes and values are in no answer.
	Visible func(ctx context.Context) func(buckets.DeviceID) bool
	// Retention is how long readings are kept: a device whose last
	// reading is older has no LastSeenName series. 0: no bound.
	Retention time.Duration
	// Timeout bounds one query's evaluation (a request's timeout
	// parameter may only lower it). Default DefaultTimeout.
	Timeout time.Duration
	// MaxSamples bounds the samples one query holds in memory at once
	// (about 16 bytes each). Default DefaultMaxSamples.
	MaxSamples int
	// MaxSeries bounds the series one selector may match. Default
	// DefaultMaxSeries.
	MaxSeries int
	// LookbackDelta is how far back an instant selector looks for a
	// sample. Default DefaultLookbackDelta.
	LookbackDelta time.Duration
	// Logger and Now default to slog.Default and time.Now.
	Logger *slog.Logger
	Now    func() time.Time
	// Extra, when its Queryable is set, adds series the store does not
	// hold (the alert series of the rule evaluator).
	Extra Extra
	// ResultCacheBytes bounds the range query answers kept so that a
	// dashboard's next refresh evaluates only its new steps (resultcache);
	// 0: DefaultResultCacheBytes, negative: none are kept. Answers are
	// kept only when Source tells of every change to its readings and
	// attributes.
	ResultCacheBytes int64
	// Build is what /api/v1/status/buildinfo reports, so that it names
	// the version and commit the binary's -version prints. An empty
	// Version reports the module version and VCS stamp Go recorded.
	Build BuildInfo
}

// API is the query API; it is an http.Handler for the paths under
// /api/v1/.
type API struct {
	engine  *promql.Engine
	lean    *promql.Engine // without the checks per sample (Instant)
	parser  parser.Parser
	q       *queryable
	timeout time.Duration
	log     *slog.Logger
	now     func() time.Time
	mux     *http.ServeMux
	extra   Extra
	build   BuildInfo
	results *rangeCache // nil: range query answers are not kept
}

// New builds the API for cfg.
func New(cfg Config) (*API, error) {
	if cfg.Source == nil {
		return nil, errors.New("promapi: Config.Source is required")
	}
	if cfg.Timeout < 0 || cfg.MaxSamples < 0 || cfg.MaxSeries < 0 || cfg.LookbackDelta < 0 || cfg.Retention < 0 {
		return nil, errors.New("promapi: Timeout, MaxSamples, MaxSeries, LookbackDelta and Retention must not be negative")
	}
	a := &API{
		q: &queryable{src: cfg.Source, visible: cfg.Visible, retention: cfg.Retention,
			lookback:   orDefault(cfg.LookbackDelta, DefaultLookbackDelta).Milliseconds(),
			maxSeries:  orDefault(cfg.MaxSeries, DefaultMaxSeries),
			maxSamples: orDefault(cfg.MaxSamples, DefaultMaxSamples), pageSize: defaultPageSize,
			recent: newRecentReads()},
		timeout: orDefault(cfg.Timeout, DefaultTimeout),
		log:     cfg.Logger,
		now:     cfg.Now,
		parser:  parser.NewParser(parser.Options{}),
		extra:   cfg.Extra,
		build:   buildOf(cfg),
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.now == nil {
		a.now = time.Now
	}
	if w, ok := cfg.Source.(watchable); ok {
		a.q.live = newLiveWindow(a.now, a.q.lookback)
		w.Watch(a.q.live.committed, a.q.live.removed)
	}
	a.results = newRangeCache(cfg.Source, orDefault(cfg.ResultCacheBytes, DefaultResultCacheBytes))
	opts := promql.EngineOpts{
		Logger:                   a.log,
		MaxSamples:               orDefault(cfg.MaxSamples, DefaultMaxSamples),
		Timeout:                  a.timeout,
		LookbackDelta:            orDefault(cfg.LookbackDelta, DefaultLookbackDelta),
		NoStepSubqueryIntervalFn: func(int64) int64 { return time.Minute.Milliseconds() },
		EnableAtModifier:         true,
		EnableNegativeOffset:     true,
		EnableDelayedNameRemoval: true,
		Parser:                   a.parser,
	}
	// The lean engine looks at the deadline between series and steps
	// only. Instant answers it evaluates queries that read short
	// series (shortReads), which stop within one series as soon.
	a.lean = promql.NewEngine(opts)
	// The engine looks at the query's deadline at every step of a range
	// function and at every sample it reads, not only between series and
	// steps of the outer query, and once more before an instant query's
	// answer: a rule or a request past its timeout stops within one step
	// (cancel_test.go).
	opts.EnableQueryCost = true
	a.engine = promql.NewEngine(opts)
	a.mux = http.NewServeMux()
	a.mux.HandleFunc("GET /api/v1/query", a.handleQuery)
	a.mux.HandleFunc("POST /api/v1/query", a.handleQuery)
	a.mux.HandleFunc("GET /api/v1/query_range", a.handleQueryRange)
	a.mux.HandleFunc("POST /api/v1/query_range", a.handleQueryRange)
	a.mux.HandleFunc("GET /api/v1/series", a.handleSeries)
	a.mux.HandleFunc("POST /api/v1/series", a.handleSeries)
	a.mux.HandleFunc("GET /api/v1/labels", a.handleLabels)
	a.mux.HandleFunc("POST /api/v1/labels", a.handleLabels)
	a.mux.HandleFunc("GET /api/v1/label/{name}/values", a.handleLabelValues)
	a.registerGrafana()
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &apiError{typ: ErrorNotFound, msg: "no such endpoint: " + r.Method + " " + r.URL.Path})
	})
	return a, nil
}

func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}

// ServeHTTP serves the /api/v1/ paths.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// queryData is the data of a query answer.
type queryData struct {
	ResultType parser.ValueType `json:"resultType"`
	Result     parser.Value     `json:"result"`
}

// handleQuery serves /api/v1/query: an instant query.
func (a *API) handleQuery(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeError(w, badData("", "cannot parse the form: %v", err))
		return
	}
	ts := a.now()
	if s := r.Form.Get("time"); s != "" {
		t, err := parseTime(s)
		if err != nil {
			writeError(w, badData("time", "%v", err))
			return
		}
		ts = t
	}
	ctx, cancel, aerr := a.withTimeout(r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	defer cancel()
	qs := r.Form.Get("query")
	if qs == "" {
		writeError(w, badData("query", "missing; give a PromQL expression"))
		return
	}
	a.run(ctx, w, r, qs, func() (promql.Query, error) { return a.newInstantQuery(ctx, qs, ts) })
}

// handleQueryRange serves /api/v1/query_range.
func (a *API) handleQueryRange(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil {
		writeError(w, badData("", "cannot parse the form: %v", err))
		return
	}
	start, end, aerr := parseTimeRange(r, time.Time{}, time.Time{})
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	s := r.Form.Get("step")
	if s == "" {
		writeError(w, badData("step", "missing; give a duration (\"5m\") or seconds"))
		return
	}
	step, perr := parseDuration(s)
	if perr != nil {
		writeError(w, badData("step", "%v", perr))
		return
	}
	if step <= 0 {
		writeError(w, badData("step", "zero or negative query resolution step widths are not accepted. Try a positive integer"))
		return
	}
	if step < time.Millisecond { // the engine evaluates at whole milliseconds
		writeError(w, badData("step", "a step below 1ms is not accepted; give at least 0.001"))
		return
	}
	if end.Sub(start)/step > MaxPoints {
		writeError(w, badData("step", "exceeded maximum resolution of %d points per timeseries. Try decreasing the query resolution (?step=XX)", MaxPoints))
		return
	}
	ctx, cancel, aerr := a.withTimeout(r)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	defer cancel()
	qs := r.Form.Get("query")
	if qs == "" {
		writeError(w, badData("query", "missing; give a PromQL expression"))
		return
	}
	a.run(ctx, w, r, qs, func() (promql.Query, error) {
		return a.newCachedRangeQuery(ctx, qs, start, end, step)
	})
}

// write writes the result or error of an evaluated query.
func (a *API) write(w http.ResponseWriter, r *http.Request, qry promql.Query, res *promql.Result) {
	if res.Err != nil {
		writeError(w, a.execError(r, res.Err))
		return
	}
	warnings, _ := res.Warnings.AsStrings(qry.String(), 10, 10)
	warnings = append(warnings, buckets.WarningsOf(r.Context()).List()...) // from the store
	switch v := res.Value.(type) {
	case promql.Matrix:
		writeMatrix(w, v, warnings)
		return
	case promql.Vector:
		writeVector(w, v, warnings)
		return
	}
	writeData(w, queryData{ResultType: res.Value.Type(), Result: res.Value}, warnings)
}

// execError maps an evaluation error as the Prometheus API does:
// timeouts and cancellations 503, store failures 500 (logged here,
// never shown), everything else 422 execution.
func (a *API) execError(r *http.Request, err error) *apiError {
	var (
		eqc promql.ErrQueryCanceled
		eqt promql.ErrQueryTimeout
		es  promql.ErrStorage
	)
	switch {
	case errors.As(err, &eqt), errors.Is(err, context.DeadlineExceeded):
		return &apiError{typ: ErrorTimeout, msg: "query timed out; narrow it or retry later"}
	case errors.As(err, &eqc), errors.Is(err, context.Canceled):
		return &apiError{typ: ErrorCanceled, msg: "query canceled"}
	case errors.Is(err, errTooManySeries):
		return &apiError{typ: ErrorExec, msg: err.Error()}
	case errors.Is(err, buckets.ErrUnavailable):
		a.log.WarnContext(r.Context(), "query could not be served", "path", r.URL.Path, "err", err)
		var cm interface{ ClientMessage() string }
		if errors.As(err, &cm) { // e.g. a cluster's partition that no owner answered
			return &apiError{typ: ErrorUnavailable, msg: cm.ClientMessage()}
		}
		return &apiError{typ: ErrorUnavailable, msg: "store temporarily unavailable; retry later"}
	case errors.As(err, &es):
		a.log.ErrorContext(r.Context(), "query failed in the store", "path", r.URL.Path, "err", err)
		return &apiError{typ: ErrorInternal, msg: "internal error"}
	}
	return &apiError{typ: ErrorExec, msg: err.Error()}
}

// withTimeout applies the request's timeout parameter (never above the
// configured one).
func (a *API) withTimeout(r *http.Request) (context.Context, context.CancelFunc, *apiError) {
	d := a.timeout
	if s := r.Form.Get("timeout"); s != "" {
		t, err := parseDuration(s)
		if err != nil || t <= 0 {
			return nil, nil, badData("timeout", "cannot parse %q as a positive duration", s)
		}
		d = min(d, t)
	}
	ctx, cancel := context.WithTimeout(r.Context(), d)
	return ctx, cancel, nil
}

// selection parses match[], start and end of the metadata endpoints.
func (a *API) selection(r *http.Request, required bool) (sets [][]*labels.Matcher, mint, maxt int64, _ *apiError) {
	if err := r.ParseForm(); err != nil {
		return nil, 0, 0, badData("", "cannot parse the form: %v", err)
	}
	ms := r.Form["match[]"]
	if required && len(ms) == 0 {
		return nil, 0, 0, badData("match[]", "no match[] parameter provided")
	}
	for _, s := range ms {
		if err := checkNesting(s); err != nil {
			return nil, 0, 0, badData("match[]", "%v", err)
		}
		m, err := a.parser.ParseMetricSelector(s)
		if err != nil {
			return nil, 0, 0, badData("match[]", "%v", err)
		}
		sets = append(sets, m)
	}
	if len(sets) == 0 {
		sets = [][]*labels.Matcher{nil}
	}
	start, end, aerr := parseTimeRange(r, minTime, maxTime)
	if aerr != nil {
		return nil, 0, 0, aerr
	}
	return sets, start.UnixMilli(), end.UnixMilli(), nil
}

// limitParam parses the limit of the metadata endpoints (0: none).
func limitParam(r *http.Request) (int, *apiError) {
	s := r.Form.Get("limit")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return 0, badData("limit", "cannot parse %q to a non-negative integer", s)
	}
	return n, nil
}

// metadataRequest reads what /series and /label(s) share: the match[]
// selection with its time range as a querier, and the limit.
func (a *API) metadataRequest(r *http.Request, required bool) ([][]*labels.Matcher, *querier, int, *apiError) {
	sets, mint, maxt, aerr := a.selection(r, required)
	if aerr != nil {
		return nil, nil, 0, aerr
	}
	limit, aerr := limitParam(r)
	if aerr != nil {
		return nil, nil, 0, aerr
	}
	return sets, &querier{q: a.q, mint: mint, maxt: maxt}, limit, nil
}

// handleSeries serves /api/v1/series: the label sets matching match[].
func (a *API) handleSeries(w http.ResponseWriter, r *http.Request) {
	sets, qr, limit, aerr := a.metadataRequest(r, true)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	seen := map[string]bool{}
	out := []labels.Labels{}
	var warnings []string
	for _, ms := range sets {
		refs, err := qr.match(r.Context(), qr.mint, qr.maxt, ms, notLive, nil)
		if err != nil {
			writeError(w, a.execError(r, err))
			return
		}
		for _, ref := range refs {
			k := ref.lset.String()
			if seen[k] {
				continue
			}
			if limit > 0 && len(out) == limit {
				warnings = []string{"results truncated due to limit"}
				break
			}
			seen[k] = true
			out = append(out, ref.lset)
		}
	}
	writeData(w, out, warnings)
}

// handleLabels serves /api/v1/labels.
func (a *API) handleLabels(w http.ResponseWriter, r *http.Request) {
	a.labelValues(w, r, "")
}

// handleLabelValues serves /api/v1/label/{name}/values.
func (a *API) handleLabelValues(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	if !model.UTF8Validation.IsValidLabelName(name) {
		writeError(w, badData("name", "invalid label name: %q", name))
		return
	}
	a.labelValues(w, r, name)
}

// labelValues answers the values of label name, or the label names
// when name is "".
func (a *API) labelValues(w http.ResponseWriter, r *http.Request, name string) {
	sets, qr, limit, aerr := a.metadataRequest(r, false)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var all []string
	for _, ms := range sets {
		var vals []string
		var err error
		if name == "" {
			vals, _, err = qr.LabelNames(r.Context(), nil, ms...)
		} else {
			vals, _, err = qr.LabelValues(r.Context(), name, nil, ms...)
		}
		if err != nil {
			writeError(w, a.execError(r, err))
			return
		}
		all = append(all, vals...)
	}
	all = sortedUnique(all)
	var warnings []string
	if limit > 0 && len(all) > limit {
		all, warnings = all[:limit], []string{"results truncated due to limit"}
	}
	writeData(w, all, warnings)
}

// minTime and maxTime stand for an absent start and end.
var (
	minTime = time.UnixMilli(math.MinInt64 / 1000 / 1000)
	maxTime = time.UnixMilli(math.MaxInt64 / 1000 / 1000)
)

// parseTimeParam parses a time parameter; def when absent (a zero def
// makes it required).
func parseTimeParam(r *http.Request, name string, def time.Time) (time.Time, error) {
	s := r.Form.Get(name)
	if s == "" {
		if def.IsZero() {
			return time.Time{}, badData(name, "missing; give RFC 3339 or Unix seconds")
		}
		return def, nil
	}
	t, err := parseTime(s)
	if err != nil {
		return time.Time{}, badData(name, "%v", err)
	}
	return t, nil
}

// parseTimeRange parses start and end (each defaulting to its def; a
// zero def makes it required) and checks that end is not before start.
func parseTimeRange(r *http.Request, defStart, defEnd time.Time) (start, end time.Time, _ *apiError) {
	start, err := parseTimeParam(r, "start", defStart)
	if err != nil {
		return start, end, err.(*apiError)
	}
	end, err = parseTimeParam(r, "end", defEnd)
	if err != nil {
		return start, end, err.(*apiError)
	}
	if end.Before(start) {
		return start, end, badData("end", "end timestamp must not be before start time")
	}
	return start, end, nil
}

var _ storage.Queryable = (*queryable)(nil)

// describe names a parameter in an error message as Prometheus does.
func describe(param string) string {
	if param == "" {
		return ""
	}
	return fmt.Sprintf("invalid parameter %q: ", param)
}
