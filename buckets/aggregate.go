package buckets

import "math"

// AggregateQuery asks for per-bucket summaries of one device's numeric
// values with From <= ticks < To. Buckets are aligned to multiples of
// Interval since the Unix epoch (UTC); Interval is in ticks and at
// least one second. Fields, when not empty, limits the value names
// summarised. At most Limit buckets are returned (oldest first); After,
// when set, resumes behind the bucket that starts at *After.
// PerMillisecond summarises, per value name, only the newest value of
// each millisecond instead of every reading: the samples a Prometheus
// series has. It is left out of JSON when false, so nodes that do not
// know it still take the other queries forwarded to them.
type AggregateQuery struct {
	Device         DeviceID
	From           Ticks // inclusive
	To             Ticks // exclusive
	Interval       Ticks
	Fields         []string
	Limit          int
	After          *Ticks
	PerMillisecond bool `json:",omitempty"`
}

// Summary is what a bucket knows of one value name: how many readings
// carried it, their sum, smallest and largest, and the values with the
// oldest and newest time. Bool counts as 0 or 1; strings are never
// summarised.
type Summary struct {
	Count      int64
	Sum        float64
	Min        float64
	Max        float64
	First      float64
	Last       float64
	FirstTicks Ticks
	LastTicks  Ticks
}

// Add folds one value observed at k into the summary.
func (s *Summary) Add(k Ticks, v float64) {
	if s.Count == 0 {
		*s = Summary{Count: 1, Sum: v, Min: v, Max: v, First: v, Last: v, FirstTicks: k, LastTicks: k}
		return
	}
	s.Count++
	s.Sum += v
	s.Min = math.Min(s.Min, v)
	s.Max = math.Max(s.Max, v)
	if k < s.FirstTicks {
		s.First, s.FirstTicks = v, k
	}
	if k >= s.LastTicks {
		s.Last, s.LastTicks = v, k
	}
}

// Merge folds another summary of the same value name into s.
func (s *Summary) Merge(o Summary) {
	if o.Count == 0 {
		return
	}
	if s.Count == 0 {
		*s = o
		return
	}
	s.Count += o.Count
	s.Sum += o.Sum
	s.Min = math.Min(s.Min, o.Min)
	s.Max = math.Max(s.Max, o.Max)
	if o.FirstTicks < s.FirstTicks {
		s.First, s.FirstTicks = o.First, o.FirstTicks
	}
	if o.LastTicks >= s.LastTicks {
		s.Last, s.LastTicks = o.Last, o.LastTicks
	}
}

// Avg is Sum / Count.
func (s Summary) Avg() float64 { return s.Sum / float64(s.Count) }

// NamedSummary is the summary of one value name.
type NamedSummary struct {
	Name    string
	Summary Summary
}

// AggregateBucket is one bucket of an aggregate answer: its start and a
// summary per value name that had at least one numeric reading in it,
// sorted by name. A bucket without readings is never returned.
type AggregateBucket struct {
	Start  Ticks
	Values []NamedSummary
}

// AggregatePage is one page of an aggregate query. More is true when at
// least one more bucket matched beyond the last one returned.
type AggregatePage struct {
	Buckets []AggregateBucket
	More    bool
}

// Numeric returns v as a float64 for aggregation: floats and ints as
// they are, bool as 0 or 1. ok is false for strings.
func Numeric(v Value) (f float64, ok bool) {
	switch v.Kind {
	case KindFloat:
		return v.AsFloat(), true
	case KindInt:
		return float64(v.AsInt()), true
	case KindBool:
		if v.AsBool() {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}
