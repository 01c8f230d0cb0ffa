package promapi

import (
	"context"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/telemetryd/telemetryd/buckets"
)

// KeepValues returns ctx marked so that an instant query made with it
// (Instant) may leave out of its answer the series whose value keep
// rejects. The caller filters the answer by keep itself: the answer
// holds every series keep accepts, and may hold others.
//
// It is used when the query is a selector alone, or a selector and a
// number or time() joined by +, -, * or / (`temp`, `battery * 10`,
// `time() - telemetry_device_last_seen_timestamp_seconds`), without
// offset or @, in a SharedReads batch: such a series' value is a
// function of the newest sample of its select, which the live window
// (or, for the last-seen series, the device index) knows as the series
// is matched. A series whose sample is not known then is kept. An
// alerting rule `<such a query> > 50` so hands the engine only the
// series over 50, not every series of the selector. The bound on the
// series a selector matches (Config.MaxSeries) counts every series
// matched, kept or not.
func KeepValues(ctx context.Context, keep func(float64) bool) context.Context {
	return context.WithValue(ctx, keepKey{}, keep)
}

type keepKey struct{}

// sampleFilterKey marks the selects of an instant query whose only
// selector's series may be left out by their sample (sampleFilter).
type sampleFilterKey struct{}

// sampleFilter tells whether a series whose newest sample in the
// select is v may stay in the answer: the query's value of the series
// is of(v), which the caller keeps or not.
type sampleFilter struct {
	of   func(v float64) float64
	keep func(float64) bool
	// The select's LastSeenName sample time, when it has one (seenOne),
	// and the retention (seenIter).
	seenAt    int64
	seenOne   bool
	retention time.Duration
}

func (f *sampleFilter) keeps(v float64) bool { return f.keep(f.of(v)) }

// lastSeenValue is the sample of d's LastSeenName series in the select,
// when it is known without reading (known): one sample, at or after
// the device's last reading, so the index's last-seen time
// (seenIter.load). f may be nil: nothing is known.
func (f *sampleFilter) lastSeenValue(d *buckets.DeviceInfo) (v float64, known bool) {
	if f == nil || !f.seenOne || f.seenAt < msOf(d.FirstSeen) || f.seenAt < msOf(d.LastSeen) {
		return 0, false
	}
	if f.retention > 0 && f.seenAt-msOf(d.LastSeen) > f.retention.Milliseconds() {
		return 0, false // no sample: the engine leaves it out
	}
	return seconds(d.LastSeen), true
}

func sampleFilterOf(ctx context.Context) *sampleFilter {
	f, _ := ctx.Value(sampleFilterKey{}).(*sampleFilter)
	return f
}

// withSampleFilter replaces the keep of KeepValues in ctx by the
// sample filter of expr evaluated at ts, or by none when expr is not of
// a form the filter holds for.
func withSampleFilter(ctx context.Context, expr parser.Expr, ts time.Time) context.Context {
	keep, _ := ctx.Value(keepKey{}).(func(float64) bool)
	if keep == nil {
		return ctx
	}
	ctx = context.WithValue(ctx, keepKey{}, nil)
	if of := valueOfSample(expr, ts); of != nil {
		ctx = context.WithValue(ctx, sampleFilterKey{}, &sampleFilter{of: of, keep: keep})
	}
	return ctx
}

// valueOfSample returns, when expr evaluated at ts is a plain selector
// (no offset, no @) or such a selector and a number or time() joined by
// +, -, * or /, the function from a series' sample to its value in the
// answer, computed as the engine computes it; nil for any other
// expression.
func valueOfSample(expr parser.Expr, ts time.Time) func(float64) float64 {
	expr = unparenExpr(expr)
	if plainSelector(expr) {
		return func(v float64) float64 { return v }
	}
	b, ok := expr.(*parser.BinaryExpr)
	if !ok || b.ReturnBool {
		return nil
	}
	// One metric name: the answer drops it, and series of two names
	// that would then share their labels are an error of the engine's
	// that leaving one out must not hide.
	lhs, rhs := unparenExpr(b.LHS), unparenExpr(b.RHS)
	var n float64
	swap := false
	switch {
	case plainSelector(lhs) && oneName(lhs):
		n, ok = scalarAt(rhs, ts)
	case plainSelector(rhs) && oneName(rhs):
		n, ok = scalarAt(lhs, ts)
		swap = true
	default:
		return nil
	}
	if !ok {
		return nil
	}
	// The engine's vector-scalar arithmetic (vectorElemBinop): the
	// vector's sample on the left unless the scalar was written first.
	switch b.Op {
	case parser.ADD:
		return func(v float64) float64 { return v + n } // commutative, bit for bit
	case parser.MUL:
		return func(v float64) float64 { return v * n }
	case parser.SUB:
		if swap {
			return func(v float64) float64 { return n - v }
		}
		return func(v float64) float64 { return v - n }
	case parser.DIV:
		if swap {
			return func(v float64) float64 { return n / v }
		}
		return func(v float64) float64 { return v / n }
	}
	return nil
}

// plainSelector reports whether e is an instant vector selector that
// no offset or @ moves.
func plainSelector(e parser.Expr) bool {
	vs, ok := e.(*parser.VectorSelector)
	return ok && vs.OriginalOffset == 0 && vs.Offset == 0 && vs.Timestamp == nil && vs.StartOrEnd == 0
}

// oneName reports whether the selector e selects one metric name.
func oneName(e parser.Expr) bool {
	for _, m := range e.(*parser.VectorSelector).LabelMatchers {
		if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
			return true
		}
	}
	return false
}

// scalarAt is the value at ts of a number literal or time().
func scalarAt(e parser.Expr, ts time.Time) (float64, bool) {
	switch e := e.(type) {
	case *parser.NumberLiteral:
		return e.Val, true
	case *parser.Call:
		if e.Func != nil && e.Func.Name == "time" && len(e.Args) == 0 {
			// The engine's time(): the evaluation time in ms, over 1000.
			return float64(ts.UnixNano()/int64(time.Millisecond)) / 1000, true
		}
	}
	return 0, false
}

func unparenExpr(e parser.Expr) parser.Expr {
	for {
		switch p := e.(type) {
		case *parser.ParenExpr:
			e = p.Expr
		case *parser.StepInvariantExpr:
			e = p.Expr
		default:
			return e
		}
	}
}
