package promapi

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/util/annotations"
)

// Extra is a set of series the store does not hold (the alerts'
// ALERTS and ALERTS_FOR_STATE, kept by the rule evaluator), answered
// beside the store's: a selector whose __name__ equals one of Names is
// asked of Extra alone, one without a __name__ equality of both.
type Extra struct {
	Names     []string
	Queryable storage.Queryable
}

// Instant evaluates qs at ts as an instant query on the engine of the
// API, under its limits (nesting, subquery points, samples, timeout),
// and returns its result as a vector (a scalar is one sample without
// labels), as Prometheus' rule evaluator does. The caller's ctx decides
// which devices are visible. It is how the service's own rules query.
func (a *API) Instant(ctx context.Context, qs string, ts time.Time) (promql.Vector, error) {
	if err := checkNesting(qs); err != nil {
		return nil, err
	}
	expr, err := a.parser.ParseExpr(qs)
	if err != nil {
		return nil, err
	}
	if err := checkSubqueries(expr); err != nil {
		return nil, err
	}
	ctx = withSampleFilter(ctx, expr, ts)
	ctx, cancel := context.WithTimeout(ctx, a.timeout)
	defer cancel()
	e := a.engine
	if a.shortReads(expr) {
		e = a.lean
	}
	qry, err := a.newInstantQueryOn(ctx, e, qs, ts)
	if err != nil {
		return nil, err
	}
	defer qry.Close()
	res := qry.Exec(ctx)
	// An answer completed past the deadline is no answer, as the
	// engine with its checks per sample has it.
	switch err := ctx.Err(); {
	case errors.Is(err, context.DeadlineExceeded):
		return nil, promql.ErrQueryTimeout("expression evaluation")
	case err != nil:
		return nil, promql.ErrQueryCanceled("expression evaluation")
	case res.Err != nil:
		return nil, res.Err
	}
	switch v := res.Value.(type) {
	case promql.Vector:
		return v, nil
	case promql.Scalar:
		return promql.Vector{promql.Sample{T: v.T, F: v.V}}, nil
	}
	return nil, fmt.Errorf("rule result is a %s, not a vector or scalar", res.Value.Type())
}

// shortReads reports whether expr reads short series only: it has no
// subquery, and no range longer than the lookback delta. Each of its
// series holds at most the samples of a lookback delta, so the lean
// engine, which looks at the deadline before each series, stops such a
// query within one short series of its deadline: the checks per sample
// would cost more than they cut.
func (a *API) shortReads(expr parser.Expr) bool {
	short := true
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.SubqueryExpr:
			short = false
		case *parser.MatrixSelector:
			short = short && n.Range.Milliseconds() <= a.q.lookback
		}
		return nil
	})
	return short
}

// withExtra is the queryable of one query: the store's, merged with
// the extra series when there are any.
func (a *API) withExtra(q storage.Queryable) storage.Queryable {
	if a.extra.Queryable == nil {
		return q
	}
	return extraQueryable{store: q, extra: a.extra}
}

// extraQueryable routes each select to the store, the extra series or
// both (Extra).
type extraQueryable struct {
	store storage.Queryable
	extra Extra
}

func (e extraQueryable) Querier(mint, maxt int64) (storage.Querier, error) {
	s, err := e.store.Querier(mint, maxt)
	if err != nil {
		return nil, err
	}
	x, err := e.extra.Queryable.Querier(mint, maxt)
	if err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return extraQuerier{store: s, extra: x, names: e.extra.Names}, nil
}

type extraQuerier struct {
	store, extra storage.Querier
	names        []string
}

// route says which queriers a select with ms asks.
func (e extraQuerier) route(ms []*labels.Matcher) (store, extra bool) {
	for _, m := range ms {
		if m.Name != model.MetricNameLabel || m.Type != labels.MatchEqual {
			continue
		}
		for _, n := range e.names {
			if m.Value == n {
				return false, true
			}
		}
		return true, false
	}
	return true, true
}

func (e extraQuerier) Select(ctx context.Context, sorted bool, hints *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	s, x := e.route(ms)
	switch {
	case s && x:
		return storage.NewMergeSeriesSet([]storage.SeriesSet{
			e.store.Select(ctx, true, hints, ms...), e.extra.Select(ctx, true, hints, ms...)}, 0, storage.ChainedSeriesMerge)
	case x:
		return e.extra.Select(ctx, sorted, hints, ms...)
	}
	return e.store.Select(ctx, sorted, hints, ms...)
}

func (e extraQuerier) LabelValues(ctx context.Context, name string, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return e.store.LabelValues(ctx, name, hints, ms...)
}

func (e extraQuerier) LabelNames(ctx context.Context, hints *storage.LabelHints, ms ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return e.store.LabelNames(ctx, hints, ms...)
}

func (e extraQuerier) Close() error { return errors.Join(e.store.Close(), e.extra.Close()) }
