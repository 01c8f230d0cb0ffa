package rules

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/telemetryd/telemetryd/api/auth"
)

// Names of the alert series, as Prometheus writes them.
const (
	AlertsName         = "ALERTS"
	AlertsForStateName = "ALERTS_FOR_STATE"
)

// SeriesNames are the names of the series Series answers.
var SeriesNames = []string{AlertsName, AlertsForStateName}

// Bounds of the alert series kept in memory.
const (
	// seriesWindow is how far back the alert series reach.
	seriesWindow = time.Hour
	// maxPoints is the most points one alert series keeps.
	maxPoints = 720
)

// seriesStore keeps the ALERTS and ALERTS_FOR_STATE series of the
// alerts this node evaluated in the last seriesWindow.
type seriesStore struct {
	mu     sync.RWMutex
	series map[string]*memSeries // by group key + labels
}

type memSeries struct {
	group string
	rule  string
	lset  labels.Labels
	pts   []point
	live  bool // its alert was active at the last evaluation
}

type point struct {
	t int64
	f float64
}

func newSeriesStore() *seriesStore { return &seriesStore{series: map[string]*memSeries{}} }

// put appends the rule's alerts at ts: ALERTS{alertstate=...} 1 and
// ALERTS_FOR_STATE with activeAt in seconds; a series whose alert went
// (or changed state) gets a stale marker.
func (s *seriesStore) put(group string, r *Rule, alerts map[uint64]*Alert, ts time.Time) {
	t := ts.UnixMilli()
	s.mu.Lock()
	defer s.mu.Unlock()
	now := map[string]bool{}
	add := func(name string, a *Alert, state string, v float64) {
		b := labels.NewBuilder(a.Labels)
		b.Set(model.MetricNameLabel, name)
		if state != "" {
			b.Set(alertStateLabel, state)
		}
		lset := b.Labels()
		k := group + "\xff" + lset.String()
		ms := s.series[k]
		if ms == nil {
			ms = &memSeries{group: group, rule: ruleKey(r), lset: lset}
			s.series[k] = ms
		}
		ms.append(point{t, v})
		ms.live = true
		now[k] = true
	}
	for _, a := range alerts {
		if a.State == StateInactive {
			continue
		}
		add(AlertsName, a, a.State.String(), 1)
		add(AlertsForStateName, a, "", float64(a.ActiveAt.Unix()))
	}
	cut := t - seriesWindow.Milliseconds()
	for k, ms := range s.series {
		if ms.group != group || ms.rule != ruleKey(r) || now[k] {
			continue
		}
		if ms.live {
			ms.append(point{t, staleNaN})
			ms.live = false
		}
		if len(ms.pts) == 0 || ms.pts[len(ms.pts)-1].t < cut {
			delete(s.series, k)
		}
	}
}

func (ms *memSeries) append(p point) {
	if n := len(ms.pts); n > 0 && ms.pts[n-1].t >= p.t {
		ms.pts[n-1] = p
		return
	}
	if len(ms.pts) >= maxPoints {
		ms.pts = slices.Delete(ms.pts, 0, len(ms.pts)-maxPoints+1)
	}
	ms.pts = append(ms.pts, p)
}

// dropGroup forgets the series of a group that is gone.
func (s *seriesStore) dropGroup(group string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, ms := range s.series {
		if ms.group == group {
			delete(s.series, k)
		}
	}
}

// Series is the queryable of the ALERTS and ALERTS_FOR_STATE series
// (promapi.Extra). A token limited to device patterns sees the series
// of its devices' alerts and those of alerts without a device label.
func (m *Manager) Series() storage.Queryable { return seriesQueryable{m.series} }

type seriesQueryable struct{ s *seriesStore }

func (q seriesQueryable) Querier(mint, maxt int64) (storage.Querier, error) {
	return seriesQuerier{s: q.s, mint: mint, maxt: maxt}, nil
}

type seriesQuerier struct {
	s          *seriesStore
	mint, maxt int64
}

func (q seriesQuerier) Select(ctx context.Context, _ bool, _ *storage.SelectHints, ms ...*labels.Matcher) storage.SeriesSet {
	p := auth.FromContext(ctx)
	q.s.mu.RLock()
	var out []storage.Series
	for _, s := range q.s.series {
		if !matches(s.lset, ms) {
			continue
		}
		if d := s.lset.Get("device"); d != "" && !p.DeviceVisible(d) {
			continue
		}
		var smpls []chunks.Sample
		for _, pt := range s.pts {
			if pt.t >= q.mint && pt.t <= q.maxt {
				smpls = append(smpls, fsample(pt))
			}
		}
		if len(smpls) > 0 {
			out = append(out, storage.NewListSeries(s.lset, smpls))
		}
	}
	q.s.mu.RUnlock()
	slices.SortFunc(out, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
	return &listSet{series: out, i: -1}
}

func matches(l labels.Labels, ms []*labels.Matcher) bool {
	for _, m := range ms {
		if !m.Matches(l.Get(m.Name)) {
			return false
		}
	}
	return true
}

func (q seriesQuerier) LabelValues(context.Context, string, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (q seriesQuerier) LabelNames(context.Context, *storage.LabelHints, ...*labels.Matcher) ([]string, annotations.Annotations, error) {
	return nil, nil, nil
}

func (q seriesQuerier) Close() error { return nil }

type listSet struct {
	series []storage.Series
	i      int
}

func (l *listSet) Next() bool                        { l.i++; return l.i < len(l.series) }
func (l *listSet) At() storage.Series                { return l.series[l.i] }
func (l *listSet) Err() error                        { return nil }
func (l *listSet) Warnings() annotations.Annotations { return nil }

// fsample is one float point as chunks.Sample.
type fsample point

func (s fsample) T() int64                      { return s.t }
func (s fsample) ST() int64                     { return 0 }
func (s fsample) F() float64                    { return s.f }
func (s fsample) H() *histogram.Histogram       { return nil }
func (s fsample) FH() *histogram.FloatHistogram { return nil }
func (s fsample) Type() chunkenc.ValueType      { return chunkenc.ValFloat }
func (s fsample) Copy() chunks.Sample           { return s }
