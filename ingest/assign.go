package ingest

import (
	"cmp"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
)

// assignmentsOf returns the attribute assignments of items, compacted
// (see compactAssignments).
func assignmentsOf(items []item) []buckets.Assignment {
	var as []buckets.Assignment
	carrying := 0
	for _, it := range items {
		if len(it.assigns) > 0 {
			as = it.assigns
			carrying++
		}
	}
	if carrying > 1 {
		as = nil // never append to a message's own slice
		for _, it := range items {
			as = append(as, it.assigns...)
		}
	}
	return compactAssignments(as)
}

// compactAssignments reduces assignments that only set attributes (as
// messages carry them) to the fewest that leave a store with the same
// attributes: since the newest assignment by At wins per attribute,
// only the value with the newest At of each device's attribute counts
// (among equal At, the greater value, as the store decides). Those are
// grouped per device and At, in device and At order. One assignment is
// returned as it is.
func compactAssignments(as []buckets.Assignment) []buckets.Assignment {
	if len(as) <= 1 {
		return as
	}
	type key struct {
		device buckets.DeviceID
		name   string
	}
	type entry struct {
		key
		at    buckets.Ticks
		value string
	}
	newest := make(map[key]int) // index in entries
	var entries []entry
	for _, a := range as {
		for _, x := range a.Set {
			k := key{a.Device, x.Name}
			i, ok := newest[k]
			switch {
			case !ok:
				newest[k] = len(entries)
				entries = append(entries, entry{k, a.At, x.Value})
			case a.At > entries[i].at || a.At == entries[i].at && x.Value > entries[i].value:
				entries[i].at, entries[i].value = a.At, x.Value
			}
		}
	}
	slices.SortFunc(entries, func(x, y entry) int {
		return cmp.Or(strings.Compare(string(x.device), string(y.device)), cmp.Compare(x.at, y.at), strings.Compare(x.name, y.name))
	})
	set := make(buckets.Attributes, len(entries))
	var out []buckets.Assignment
	start := 0 // of the group of entries[i]
	for i, e := range entries {
		set[i] = buckets.Attribute{Name: e.name, Value: e.value}
		if i > 0 && e.device == entries[i-1].device && e.at == entries[i-1].at {
			out[len(out)-1].Set = set[start : i+1 : i+1]
			continue
		}
		start = i
		out = append(out, buckets.Assignment{Device: e.device, At: e.at, Set: set[i : i+1 : i+1]})
	}
	return out
}
