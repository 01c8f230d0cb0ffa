package promapi

import (
	"context"
	"time"

	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/storage"
)

// queryShape is what a select's hints leave out about the query it
// belongs to: whether the query is instant or its range, and whether an
// offset or @ moves any of its selectors or subqueries. With it a
// select inside a subquery can tell when the engine evaluates it.
type queryShape struct {
	instant     bool
	start, step int64 // a range query's start and step, ms
	shifted     bool  // some selector or subquery has an offset or @
}

// shapeOf returns the shape of the statement of qry.
func shapeOf(qry promql.Query) *queryShape {
	es, ok := qry.Statement().(*parser.EvalStmt)
	if !ok {
		return nil
	}
	s := &queryShape{instant: es.Interval == 0, start: es.Start.UnixMilli(), step: es.Interval.Milliseconds()}
	parser.Inspect(es.Expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			s.shifted = s.shifted || n.OriginalOffset != 0 || n.Timestamp != nil || n.StartOrEnd != 0
		case *parser.SubqueryExpr:
			s.shifted = s.shifted || n.OriginalOffset != 0 || n.Timestamp != nil || n.StartOrEnd != 0
		}
		return nil
	})
	return s
}

// inSubquery reports whether the select of h is evaluated by a subquery
// and nothing shifts its times, so that the engine evaluates it at the
// multiples of h.Step (a subquery's steps are the multiples of its step
// within its range) and h.Start+h.Range-1 is at or before the first.
// In an instant query every select with a step is in a subquery; in a
// range query, one whose step is not the query's, or, when the query's
// start is a multiple of its step, one whose first window would not end
// on a multiple (the query's own selects end theirs on its steps).
func (s *queryShape) inSubquery(h *storage.SelectHints) bool {
	switch {
	case s == nil || s.shifted || h.Step <= 0:
		return false
	case s.instant:
		return true
	}
	return h.Step != s.step || s.start%s.step == 0
}

// newInstantQuery is the engine's instant query over a queryable that
// knows the query's shape.
func (a *API) newInstantQuery(ctx context.Context, qs string, ts time.Time) (promql.Query, error) {
	return a.newInstantQueryOn(ctx, a.engine, qs, ts)
}

// newInstantQueryOn is newInstantQuery on engine e.
func (a *API) newInstantQueryOn(ctx context.Context, e *promql.Engine, qs string, ts time.Time) (promql.Query, error) {
	q := *a.q
	qry, err := e.NewInstantQuery(ctx, a.withExtra(&q), nil, qs, ts)
	if err == nil {
		q.shape = shapeOf(qry)
	}
	return qry, err
}

// newRangeQuery is the engine's range query over a queryable that
// knows the query's shape.
func (a *API) newRangeQuery(ctx context.Context, qs string, start, end time.Time, step time.Duration) (promql.Query, error) {
	q := *a.q
	qry, err := a.engine.NewRangeQuery(ctx, a.withExtra(&q), nil, qs, start, end, step)
	if err == nil {
		q.shape = shapeOf(qry)
	}
	return qry, err
}
