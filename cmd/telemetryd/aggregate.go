package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// rangeAggregator answers aggregate queries by folding the readings of
// a range scan into buckets. It is the first version of the aggregate
// primitive, used until the store answers aggregates from its block
// headers: correct for every query, but it reads every reading of the
// window (memory stays bounded: one page of readings and at most
// Limit+1 buckets at a time).
type rangeAggregator struct {
	r interface {
		Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error)
	}
}

var _ api.Aggregator = rangeAggregator{}

// unixEpoch is 1970-01-01T00:00:00Z in ticks: buckets align to it.
var unixEpoch = buckets.MustTicks(time.Unix(0, 0))

// bucketStart returns the start of the interval-wide bucket holding k.
func bucketStart(k, interval buckets.Ticks) buckets.Ticks {
	d := k - unixEpoch
	q := d / interval
	if d%interval < 0 {
		q--
	}
	return unixEpoch + q*interval
}

// rangePage is how many readings one scan step reads.
const rangePage = 10000

// Aggregate implements api.Aggregator over Range.
func (a rangeAggregator) Aggregate(ctx context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error) {
	if q.Interval < buckets.TicksPerSecond || q.Limit <= 0 {
		return buckets.AggregatePage{}, fmt.Errorf("%w: aggregate: interval %d ticks and limit %d", buckets.ErrInvalidArgument, q.Interval, q.Limit)
	}
	from := q.From
	if q.After != nil {
		from = max(from, bucketStart(*q.After, q.Interval)+q.Interval)
	}
	var out []buckets.AggregateBucket
	var cur map[string]*buckets.Summary
	curStart := buckets.Ticks(-1)
	flush := func() {
		if len(cur) == 0 {
			return
		}
		b := buckets.AggregateBucket{Start: curStart, Values: make([]buckets.NamedSummary, 0, len(cur))}
		for n, s := range cur {
			b.Values = append(b.Values, buckets.NamedSummary{Name: n, Summary: *s})
		}
		slices.SortFunc(b.Values, func(x, y buckets.NamedSummary) int {
			if x.Name < y.Name {
				return -1
			}
			if x.Name > y.Name {
				return 1
			}
			return 0
		})
		out = append(out, b)
	}
	rq := buckets.RangeQuery{Device: q.Device, From: from, To: q.To, Order: buckets.Asc, Limit: rangePage}
	for from < q.To {
		page, err := a.r.Range(ctx, rq)
		if err != nil {
			return buckets.AggregatePage{}, fmt.Errorf("aggregate %s: %w", q.Device, err)
		}
		for _, r := range page.Readings {
			st := bucketStart(r.Ticks, q.Interval)
			if st != curStart {
				flush()
				if len(out) > q.Limit {
					return buckets.AggregatePage{Buckets: out[:q.Limit], More: true}, nil
				}
				cur, curStart = map[string]*buckets.Summary{}, st
			}
			for _, f := range r.Values {
				v, ok := buckets.Numeric(f.Value)
				if !ok || (len(q.Fields) > 0 && !slices.Contains(q.Fields, f.Name)) {
					continue
				}
				s := cur[f.Name]
				if s == nil {
					s = &buckets.Summary{}
					cur[f.Name] = s
				}
				s.Add(r.Ticks, v)
			}
		}
		if !page.More || len(page.Readings) == 0 {
			break
		}
		last := page.Readings[len(page.Readings)-1].Ticks
		rq.After = &last
	}
	flush()
	if len(out) > q.Limit {
		return buckets.AggregatePage{Buckets: out[:q.Limit], More: true}, nil
	}
	return buckets.AggregatePage{Buckets: out}, nil
}
