package devindex

import (
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
)

// attrPostings is the in-memory form of the index entities: for every
// attribute name and value, the devices that have it, ascending. It is
// rebuilt from the attribute records at open and changed under the
// device index lock after each commit.
type attrPostings map[string]*nameValues

// posting is one device of a posting list, with its entry, so a query
// reads the device without a map lookup.
type posting struct {
	id buckets.DeviceID
	e  *deviceEntry
}

// comparePosting orders postings by device ID.
func comparePosting(p posting, id buckets.DeviceID) int {
	return strings.Compare(string(p.id), string(id))
}

// nameValues holds the values of one attribute name.
type nameValues struct {
	devices map[string][]posting // by value, ascending by device
	values  []string             // the keys of devices, ascending
	count   int                  // devices with the name
}

// add records that dev (whose entry is e) has name=value.
func (p attrPostings) add(name, value string, dev buckets.DeviceID, e *deviceEntry) {
	nv := p[name]
	if nv == nil {
		nv = &nameValues{devices: make(map[string][]posting)}
		p[name] = nv
	}
	list, known := nv.devices[value]
	if !known {
		i, _ := slices.BinarySearch(nv.values, value)
		nv.values = slices.Insert(nv.values, i, value)
	}
	i, found := slices.BinarySearchFunc(list, dev, comparePosting)
	if found {
		return
	}
	nv.devices[value] = slices.Insert(list, i, posting{id: dev, e: e})
	nv.count++
}

// appendSorted adds dev, which sorts after every device of the list
// already, to name=value: the fast path of building all lists from the
// records in device order.
func (p attrPostings) appendSorted(name, value string, dev buckets.DeviceID, e *deviceEntry) {
	nv := p[name]
	if nv == nil {
		nv = &nameValues{devices: make(map[string][]posting)}
		p[name] = nv
	}
	list, known := nv.devices[value]
	if !known {
		nv.values = append(nv.values, value) // sorted by finishLoad
	}
	nv.devices[value] = append(list, posting{id: dev, e: e})
	nv.count++
}

// finishLoad sorts the value lists appendSorted left unsorted.
func (p attrPostings) finishLoad() {
	for _, nv := range p {
		slices.Sort(nv.values)
	}
}

// remove records that dev no longer has name=value.
func (p attrPostings) remove(name, value string, dev buckets.DeviceID) {
	nv := p[name]
	if nv == nil {
		return
	}
	list := nv.devices[value]
	i, found := slices.BinarySearchFunc(list, dev, comparePosting)
	if !found {
		return
	}
	nv.count--
	if len(list) > 1 {
		nv.devices[value] = slices.Delete(list, i, i+1)
		return
	}
	delete(nv.devices, value)
	if j, ok := slices.BinarySearch(nv.values, value); ok {
		nv.values = slices.Delete(nv.values, j, j+1)
	}
	if len(nv.values) == 0 {
		delete(p, name)
	}
}

// change moves the postings of dev (whose entry is e) from the
// attribute set old to new.
func (p attrPostings) change(dev buckets.DeviceID, e *deviceEntry, old, new buckets.Attributes) {
	for _, a := range old {
		if v, ok := new.Get(a.Name); !ok || v != a.Value {
			p.remove(a.Name, a.Value, dev)
		}
	}
	for _, a := range new {
		if v, ok := old.Get(a.Name); !ok || v != a.Value {
			p.add(a.Name, a.Value, dev, e)
		}
	}
}

// attrChanges lists the index entity keys to write and delete when dev's
// set goes from old to new.
func attrChanges(dev buckets.DeviceID, old, new buckets.Attributes) (set, del [][]byte) {
	for _, a := range old {
		if v, ok := new.Get(a.Name); !ok || v != a.Value {
			del = append(del, EntityKey(a.Name, a.Value, dev))
		}
	}
	for _, a := range new {
		if v, ok := old.Get(a.Name); !ok || v != a.Value {
			set = append(set, EntityKey(a.Name, a.Value, dev))
		}
	}
	return set, del
}
