package devindex

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
)

// deviceLabel is the matcher name that selects by device ID.
const deviceLabel = "device"

// Devices lists the known devices q selects, sorted by ID, at most
// q.Limit of them; more is true when further devices match. Each
// carries its attributes.
//
// Matchers follow PromQL: an attribute a device lacks matches as the
// empty string, and "device" matches the device ID. A matcher that
// cannot match the empty string (fleet="East", model=~"F-.*") draws
// its candidates from the postings of the values it matches, the
// smallest such set driving the listing, so such a query never walks
// every device; the other matchers, SilentBefore and Visible are then
// checked per candidate. Prefix and After start every list by binary
// search.
func (x *Index) Devices(ctx context.Context, q buckets.DeviceQuery) (infos []buckets.DeviceInfo, more bool, err error) {
	if q.Limit <= 0 {
		return nil, false, fmt.Errorf("%w: limit %d must be positive", buckets.ErrInvalidArgument, q.Limit)
	}
	x.mu.RLock()
	defer x.mu.RUnlock()
	infos = make([]buckets.DeviceInfo, 0, min(q.Limit, len(x.devices), 1024)) // a page of 1000 without growing
	w := &walk{ctx: ctx, q: &q}
	x.selectDevices(w, func(d buckets.DeviceID, e *deviceEntry) bool {
		if len(infos) == q.Limit {
			more = true
			return false
		}
		infos = append(infos, e.info(d))
		return true
	})
	if w.err != nil {
		return nil, false, w.err
	}
	return infos, more, nil
}

// AttributeNames returns the attribute names, sorted, among the devices
// q selects (Limit is ignored). A name is listed only when some
// selected device has it.
func (x *Index) AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	names := make([]string, 0, len(x.postings))
	for name := range x.postings {
		names = append(names, name)
	}
	slices.Sort(names)
	if unfiltered(&q) {
		return names, nil
	}
	w := &walk{ctx: ctx, q: &q}
	if d := x.driver(&q); d != nil {
		seen := make(map[string]struct{})
		x.selectDevices(w, func(_ buckets.DeviceID, e *deviceEntry) bool {
			for _, a := range e.attributes() {
				seen[a.Name] = struct{}{}
			}
			return len(seen) < len(names)
		})
		return slices.DeleteFunc(names, func(n string) bool { _, ok := seen[n]; return !ok }), w.err
	}
	names = slices.DeleteFunc(names, func(n string) bool {
		nv := x.postings[n]
		return !slices.ContainsFunc(nv.values, func(v string) bool { return x.anySelected(nv.devices[v], w) })
	})
	return names, w.err
}

// AttributeValues returns the values of the attribute name, sorted,
// among the devices q selects (Limit is ignored). A value is listed
// only when some selected device has it.
func (x *Index) AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	nv := x.postings[name]
	if nv == nil {
		return []string{}, nil
	}
	if unfiltered(&q) {
		return slices.Clone(nv.values), nil
	}
	w := &walk{ctx: ctx, q: &q}
	if d := x.driver(&q); d != nil && d.size < nv.count {
		seen := make(map[string]struct{})
		x.selectDevices(w, func(_ buckets.DeviceID, e *deviceEntry) bool {
			if v, ok := e.attributes().Get(name); ok {
				seen[v] = struct{}{}
			}
			return len(seen) < len(nv.values)
		})
		out := make([]string, 0, len(seen))
		for _, v := range nv.values {
			if _, ok := seen[v]; ok {
				out = append(out, v)
			}
		}
		return out, w.err
	}
	out := make([]string, 0, len(nv.values))
	for _, v := range nv.values {
		if x.anySelected(nv.devices[v], w) {
			out = append(out, v)
		}
	}
	return out, w.err
}

// unfiltered reports whether q selects every device.
func unfiltered(q *buckets.DeviceQuery) bool {
	return q.Prefix == "" && q.After == "" && len(q.Match) == 0 && q.SilentBefore == 0 && q.Visible == nil
}

// walkCheckEvery is how many devices a walk examines between looks at
// its context.
const walkCheckEvery = 1024

// walk is one pass of a query over the index. It stops, setting err,
// when its context ends.
type walk struct {
	ctx context.Context
	q   *buckets.DeviceQuery
	n   int
	err error
}

// stopped counts one device examined and reports whether the walk must
// stop.
func (w *walk) stopped() bool {
	if w.n++; w.n%walkCheckEvery == 0 && w.err == nil {
		w.err = w.ctx.Err()
	}
	return w.err != nil
}

// selectDevices calls fn with each device w's query selects, in ID
// order, until fn returns false or the walk stops. x.mu must be held.
func (x *Index) selectDevices(w *walk, fn func(buckets.DeviceID, *deviceEntry) bool) {
	q := w.q
	start, after := startOf(q)
	var it deviceIter
	if d := x.driver(q); d != nil {
		it = newUnion(d.lists, start, after)
	} else {
		i, found := slices.BinarySearch(x.sorted, start)
		if found && after {
			i++
		}
		it = &idCursor{ids: x.sorted[i:], devices: x.devices}
	}
	for p, ok := it.next(); ok && strings.HasPrefix(string(p.id), q.Prefix) && !w.stopped(); p, ok = it.next() {
		if p.e == nil || !selects(q, p.id, p.e) {
			continue
		}
		if !fn(p.id, p.e) {
			return
		}
	}
}

// anySelected reports whether w's query selects any device of list.
func (x *Index) anySelected(list []posting, w *walk) bool {
	q := w.q
	start, after := startOf(q)
	for i := lowerBound(list, start, after); i < len(list) && strings.HasPrefix(string(list[i].id), q.Prefix) && !w.stopped(); i++ {
		if selects(q, list[i].id, list[i].e) {
			return true
		}
	}
	return false
}

// startOf is where a listing for q starts: the first device at or
// after start, skipping start itself when after is set.
func startOf(q *buckets.DeviceQuery) (start buckets.DeviceID, after bool) {
	if q.After != "" && string(q.After) >= q.Prefix {
		return q.After, true
	}
	return buckets.DeviceID(q.Prefix), false
}

// lowerBound is the index of the first device of list at or after
// start (after start, when after is set).
func lowerBound(list []posting, start buckets.DeviceID, after bool) int {
	i, found := slices.BinarySearchFunc(list, start, comparePosting)
	if found && after {
		i++
	}
	return i
}

// selects reports whether dev passes q's matchers, SilentBefore and
// Visible.
func selects(q *buckets.DeviceQuery, dev buckets.DeviceID, e *deviceEntry) bool {
	if q.SilentBefore != 0 && e.last >= q.SilentBefore {
		return false
	}
	for _, m := range q.Match {
		var v string
		if m.Name == deviceLabel {
			v = string(dev)
		} else {
			v, _ = e.attributes().Get(m.Name)
		}
		if !m.Matches(v) {
			return false
		}
	}
	return q.Visible == nil || q.Visible(dev)
}

// candidates are the devices one matcher can match, as disjoint sorted
// lists.
type candidates struct {
	lists [][]posting
	size  int
}

// driver returns the smallest candidate set of q's matchers that cannot
// match the empty string, or nil when every matcher can (then only a
// walk over every device answers).
func (x *Index) driver(q *buckets.DeviceQuery) *candidates {
	var best *candidates
	for _, m := range q.Match {
		c := x.candidatesOf(m)
		if c != nil && (best == nil || c.size < best.size) {
			best = c
		}
	}
	return best
}

// candidatesOf returns the devices m can match, or nil when m matches
// the empty string (a device without the attribute) or names devices
// by a pattern that needs a walk.
func (x *Index) candidatesOf(m *buckets.Matcher) *candidates {
	if m.Matches("") {
		return nil
	}
	if m.Name == deviceLabel {
		return x.deviceCandidates(m)
	}
	c := &candidates{}
	nv := x.postings[m.Name]
	if nv == nil {
		return c
	}
	add := func(v string) {
		if list := nv.devices[v]; len(list) > 0 {
			c.lists = append(c.lists, list)
			c.size += len(list)
		}
	}
	switch set := m.SetMatches(); {
	case m.Type == buckets.MatchEqual:
		add(m.Value)
	case m.Type == buckets.MatchRegexp && set != nil:
		set = slices.Clone(set)
		slices.Sort(set)
		for _, v := range slices.Compact(set) {
			add(v)
		}
	default:
		for _, v := range nv.values {
			if m.Matches(v) {
				add(v)
			}
		}
	}
	return c
}

// deviceCandidates returns the known devices an equality or literal
// alternation on the device ID names, or nil for other patterns.
func (x *Index) deviceCandidates(m *buckets.Matcher) *candidates {
	var ids []string
	switch set := m.SetMatches(); {
	case m.Type == buckets.MatchEqual:
		ids = []string{m.Value}
	case m.Type == buckets.MatchRegexp && set != nil:
		ids = slices.Clone(set)
		slices.Sort(ids)
		ids = slices.Compact(ids)
	default:
		return nil
	}
	list := make([]posting, 0, len(ids))
	for _, id := range ids {
		if e := x.devices[buckets.DeviceID(id)]; e != nil {
			list = append(list, posting{id: buckets.DeviceID(id), e: e})
		}
	}
	return &candidates{lists: [][]posting{list}, size: len(list)}
}

// deviceIter yields devices in ascending order.
type deviceIter interface {
	next() (posting, bool)
}

// idCursor yields the devices of a sorted list of IDs.
type idCursor struct {
	ids     []buckets.DeviceID
	devices map[buckets.DeviceID]*deviceEntry
}

func (c *idCursor) next() (posting, bool) {
	if len(c.ids) == 0 {
		return posting{}, false
	}
	id := c.ids[0]
	c.ids = c.ids[1:]
	return posting{id: id, e: c.devices[id]}, true
}

// cursor is a position in one sorted list.
type cursor struct {
	list []posting
	i    int
}

// union merges disjoint sorted lists into one ascending sequence.
type union []cursor

func newUnion(lists [][]posting, start buckets.DeviceID, after bool) deviceIter {
	u := make(union, 0, len(lists))
	for _, l := range lists {
		if i := lowerBound(l, start, after); i < len(l) {
			u = append(u, cursor{list: l, i: i})
		}
	}
	if len(u) == 1 {
		return &u[0]
	}
	heap.Init(&u)
	return &u
}

func (c *cursor) next() (posting, bool) {
	if c.i >= len(c.list) {
		return posting{}, false
	}
	c.i++
	return c.list[c.i-1], true
}

func (u *union) next() (posting, bool) {
	if len(*u) == 0 {
		return posting{}, false
	}
	c := &(*u)[0]
	d := c.list[c.i]
	c.i++
	if c.i == len(c.list) {
		heap.Pop(u)
	} else {
		heap.Fix(u, 0)
	}
	return d, true
}

func (u union) Len() int           { return len(u) }
func (u union) Less(i, j int) bool { return u[i].list[u[i].i].id < u[j].list[u[j].i].id }
func (u union) Swap(i, j int)      { u[i], u[j] = u[j], u[i] }
func (u *union) Push(x any)        { *u = append(*u, x.(cursor)) }
func (u *union) Pop() any {
	old := *u
	c := old[len(old)-1]
	*u = old[:len(old)-1]
	return c
}
