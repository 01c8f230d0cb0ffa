package promapi

import (
	"context"
	"sort"

	"github.com/prometheus/prometheus/storage"
)

// lastEnds are the ends of the windows of a last_over_time select of a
// range query's own steps: first, first+step, ... up to last (ms).
type lastEnds struct {
	first, step, last int64
}

// lastEndsOf reports the window ends of a select whose only use is
// last_over_time at the range query's steps (not in a subquery, nothing
// shifted): its first window ends at the query's start. Of such a
// select the engine looks at the newest sample at or before each end
// only, so the samples it is given may be just those (thinLast): with
// a window of hours and a step of a minute, a hundredth of them.
func lastEndsOf(h *storage.SelectHints, s *queryShape) (lastEnds, bool) {
	if h == nil || s == nil || h.Func != "last_over_time" || s.instant || s.shifted ||
		h.Range <= 0 || h.Step != s.step || h.Start+h.Range-1 != s.start {
		return lastEnds{}, false
	}
	return lastEnds{first: s.start, step: h.Step, last: h.End}, true
}

// thinLast is the samples of ss (ascending) that are the newest at or
// before some end of e: for each window (end-range, end] the newest of
// them is the newest of ss, whatever the range.
func thinLast(ss []sample, e lastEnds) []sample {
	var out []sample
	for end := e.first; end <= e.last; end += e.step {
		i := sort.Search(len(ss), func(i int) bool { return ss[i].t > end }) - 1
		if i < 0 || (len(out) > 0 && out[len(out)-1].t == ss[i].t) {
			continue
		}
		if out == nil {
			out = make([]sample, 0, (e.last-end)/e.step+1)
		}
		out = append(out, ss[i])
	}
	return out
}

// thinnedIter is loadedIter with only the samples thinLast keeps.
func thinnedIter(ctx context.Context, c *sampleCache, sp sampleSpan, name string, e lastEnds) seekingIter[int64] {
	s, err := c.take(ctx, sp, name)
	return seekingIter[int64]{&sampleIter{ctx: ctx, dev: sp.dev, name: name, done: true, buf: thinLast(s, e), i: -1, err: err}}
}
