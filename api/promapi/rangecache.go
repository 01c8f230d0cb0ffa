package promapi

import (
	"context"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/util/stats"

	"github.com/telemetryd/telemetryd/api/promapi/resultcache"
	"github.com/telemetryd/telemetryd/buckets"
)

// attributeGenerations is a Source that counts the changes of device
// attributes (store.Store.AttributeGeneration): an answer kept for a
// range query is one with the attributes it was evaluated with.
type attributeGenerations interface {
	AttributeGeneration() uint64
}

// rangeCache keeps range query answers by step (resultcache), when the
// source tells of every change to its readings and its attributes.
type rangeCache struct {
	c     *resultcache.Cache
	attrs attributeGenerations
}

// newRangeCache is the range cache of src holding at most maxBytes, nil
// when src does not tell of its changes or maxBytes is not positive.
func newRangeCache(src Source, maxBytes int64) *rangeCache {
	w, ok := src.(watchable)
	ag, ok2 := src.(attributeGenerations)
	if !ok || !ok2 || maxBytes <= 0 {
		return nil
	}
	rc := &rangeCache{c: resultcache.New(maxBytes), attrs: ag}
	w.Watch(rc.committed, func(buckets.DeviceID) { rc.c.Removed() })
	return rc
}

// committed lets go of the kept steps at and after the oldest of rs.
func (rc *rangeCache) committed(rs []buckets.Reading) {
	if len(rs) == 0 || !rc.c.Active() {
		return
	}
	oldest := rs[0].Ticks
	for i := range rs {
		oldest = min(oldest, rs[i].Ticks)
	}
	rc.c.Committed(msOf(oldest))
}

// cacheable reports whether the answer of expr at a step depends only on
// the step and the store's readings: no @ modifier or negative offset
// (a step would read data after itself, or the query's start or end),
// and every selector names its series by a __name__ matcher that rules
// out LastSeenName (which follows the clock) and the extra series
// (which the store does not tell of).
func (a *API) cacheable(expr parser.Expr) bool {
	ok := true
	names := append([]string{LastSeenName}, a.extra.Names...)
	if a.extra.Queryable == nil {
		names = names[:1]
	}
	parser.Inspect(expr, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			ok = ok && n.Timestamp == nil && n.StartOrEnd == 0 && n.OriginalOffset >= 0 && namesRuledOut(n, names)
		case *parser.SubqueryExpr:
			ok = ok && n.Timestamp == nil && n.StartOrEnd == 0 && n.OriginalOffset >= 0
		}
		return nil
	})
	return ok
}

// namesRuledOut reports whether some __name__ matcher of vs matches
// none of names.
func namesRuledOut(vs *parser.VectorSelector, names []string) bool {
	for _, m := range vs.LabelMatchers {
		if m.Name != model.MetricNameLabel {
			continue
		}
		matches := false
		for _, n := range names {
			matches = matches || m.Matches(n)
		}
		if !matches {
			return true
		}
	}
	return false
}

// newCachedRangeQuery is newRangeQuery answered in part or whole from
// the range cache: only the steps after those kept are evaluated. A
// request limited to some devices, or a query whose steps do not stand
// alone (cacheable), is evaluated whole and not kept. step is at least
// a millisecond (handleQueryRange refuses less).
func (a *API) newCachedRangeQuery(ctx context.Context, qs string, start, end time.Time, step time.Duration) (promql.Query, error) {
	if a.results == nil || (a.q.visible != nil && a.q.visible(ctx) != nil) {
		return a.newRangeQuery(ctx, qs, start, end, step)
	}
	expr, err := a.parser.ParseExpr(qs)
	if err != nil || !a.cacheable(expr) {
		return a.newRangeQuery(ctx, qs, start, end, step)
	}
	s, e, st := start.UnixMilli(), end.UnixMilli(), step.Milliseconds()
	end = time.UnixMilli(s + (e-s)/st*st) // the last step, as the engine evaluates it
	e = end.UnixMilli()
	attrs := a.results.attrs.AttributeGeneration()
	kept, next, fill := a.results.c.Get(resultcache.KeyOf(qs, s, st), s, e, attrs)
	cq := &cachedQuery{rc: a.results, text: qs, kept: kept, fill: fill, start: s, end: e}
	if next <= e {
		if cq.Query, err = a.newRangeQuery(ctx, qs, time.UnixMilli(next), end, step); err != nil {
			a.results.c.Drop(fill)
			return nil, err
		}
	}
	return cq, nil
}

// cachedQuery is a range query made of kept steps and, when some are
// missing, the engine's query of the steps after them (Query).
type cachedQuery struct {
	promql.Query // nil when every step is kept
	rc           *rangeCache
	text         string
	kept         promql.Matrix
	fill         *resultcache.Fill
	start, end   int64
}

// Exec evaluates the missing steps, merges them after the kept ones and
// keeps the answer when it has no warnings (a partial answer of a
// cluster, an annotation of the engine) and no histograms.
func (q *cachedQuery) Exec(ctx context.Context) *promql.Result {
	res := &promql.Result{Value: promql.Matrix{}}
	if q.Query != nil {
		res = q.Query.Exec(ctx)
	}
	fresh, ok := res.Value.(promql.Matrix)
	if res.Err != nil || !ok {
		q.rc.c.Drop(q.fill)
		return res
	}
	m := resultcache.Merge(q.kept, fresh)
	res.Value = m
	keep := len(res.Warnings) == 0 && len(buckets.WarningsOf(ctx).List()) == 0
	for i := range m {
		keep = keep && len(m[i].Histograms) == 0
	}
	if keep {
		q.rc.c.Put(q.fill, m, q.start, q.end, q.rc.attrs.AttributeGeneration())
	} else {
		q.rc.c.Drop(q.fill)
	}
	return res
}

// Close gives the engine's query back.
func (q *cachedQuery) Close() {
	if q.Query != nil {
		q.Query.Close()
	}
}

// String is the query's text.
func (q *cachedQuery) String() string { return q.text }

// Statement is the engine query's statement, nil when every step is kept.
func (q *cachedQuery) Statement() parser.Statement {
	if q.Query == nil {
		return nil
	}
	return q.Query.Statement()
}

// Stats is the engine query's statistics, nil when every step is kept.
func (q *cachedQuery) Stats() *stats.Statistics {
	if q.Query == nil {
		return nil
	}
	return q.Query.Stats()
}

// Cancel cancels the engine's query.
func (q *cachedQuery) Cancel() {
	if q.Query != nil {
		q.Query.Cancel()
	}
}
