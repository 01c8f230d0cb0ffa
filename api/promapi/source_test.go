package promapi

import (
	"context"
	"slices"
	"strings"
	"sync"

	"github.com/telemetryd/telemetryd/buckets"
)

// selects reports whether q keeps d, as the store decides: every
// matcher on its attributes (a missing one matches as ""; "device" is
// the ID), silence, visibility.
func selects(q buckets.DeviceQuery, d *buckets.DeviceInfo) bool {
	for _, m := range q.Match {
		v, _ := d.Attributes.Get(m.Name)
		if m.Name == labelDevice {
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

// memSource is an in-memory Source and AttributeIndex that answers like
// the store: Range honours From, To, Order, Limit and After; Devices
// every field of the query. It counts the calls.
type memSource struct {
	mu       sync.Mutex
	devs     []buckets.DeviceInfo // sorted by ID
	readings map[buckets.DeviceID][]buckets.Reading
	ranges   int
	listed   []buckets.DeviceQuery
}

func newMemSource() *memSource { return &memSource{readings: map[buckets.DeviceID][]buckets.Reading{}} }

// add stores readings in time order and keeps the index (first, last
// seen, latest values) up to date; attrs gives the device attributes.
func (s *memSource) add(dev buckets.DeviceID, attrs buckets.Attributes, rs ...buckets.Reading) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := slices.BinarySearchFunc(s.devs, dev, func(d buckets.DeviceInfo, id buckets.DeviceID) int {
		return strings.Compare(string(d.Device), string(id))
	})
	if !ok {
		s.devs = slices.Insert(s.devs, i, buckets.DeviceInfo{Device: dev})
	}
	d := &s.devs[i]
	if attrs != nil {
		d.Attributes = attrs
	}
	for _, r := range rs {
		r.Device = dev
		s.readings[dev] = append(s.readings[dev], r)
		if d.FirstSeen == 0 || r.Ticks < d.FirstSeen {
			d.FirstSeen = r.Ticks
		}
		if r.Ticks >= d.LastSeen {
			d.LastSeen, d.Latest = r.Ticks, r.Values
		}
	}
	slices.SortFunc(s.readings[dev], func(a, b buckets.Reading) int { return int(a.Ticks - b.Ticks) })
}

func (s *memSource) Devices(_ context.Context, q buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listed = append(s.listed, q)
	var out []buckets.DeviceInfo
	for _, d := range s.devs {
		if !strings.HasPrefix(string(d.Device), q.Prefix) || d.Device <= q.After || !selects(q, &d) {
			continue
		}
		if len(out) == q.Limit {
			return out, true, nil
		}
		out = append(out, d)
	}
	return out, false, nil
}

func (s *memSource) Range(_ context.Context, q buckets.RangeQuery) (buckets.Page, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ranges++
	rs := slices.Clone(s.readings[q.Device])
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

func (s *memSource) AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error) {
	return s.attributeValues("", q), nil
}

func (s *memSource) AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error) {
	return s.attributeValues(name, q), nil
}

func (s *memSource) attributeValues(name string, q buckets.DeviceQuery) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listed = append(s.listed, q)
	out := []string{}
	for _, d := range s.devs {
		if !strings.HasPrefix(string(d.Device), q.Prefix) || !selects(q, &d) {
			continue
		}
		for _, a := range d.Attributes {
			switch {
			case name == "":
				out = append(out, a.Name)
			case a.Name == name:
				out = append(out, a.Value)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// rangeCalls is how many Range calls were made.
func (s *memSource) rangeCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ranges
}
