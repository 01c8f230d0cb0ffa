package store

import (
	"slices"

	"github.com/telemetryd/telemetryd/buckets"
)

// attrPostings is the in-memory form of the index entities: for every
// attribute name and value, the devices that have it, ascending. It is
// rebuilt from the attribute records at open and changed under the
// device index lock after each commit.
type attrPostings map[string]*nameValues

// nameValues holds the values of one attribute name.
type nameValues struct {
	devices map[string][]buckets.DeviceID // by value, ascending
	values  []string                      // the keys of devices, ascending
	count   int                           // devices with the name
}

// add records that dev has name=value.
func (p attrPostings) add(name, value string, dev buckets.DeviceID) {
	nv := p[name]
	if nv == nil {
		nv = &nameValues{devices: make(map[string][]buckets.DeviceID)}
		p[name] = nv
	}
	list, known := nv.devices[value]
	if !known {
		i, _ := slices.BinarySearch(nv.values, value)
		nv.values = slices.Insert(nv.values, i, value)
	}
	i, found := slices.BinarySearch(list, dev)
	if found {
		return
	}
	nv.devices[value] = slices.Insert(list, i, dev)
	nv.count++
}

// appendSorted adds dev, which sorts after every device of the list
// already, to name=value: the fast path of building all lists from the
// records in device order.
func (p attrPostings) appendSorted(name, value string, dev buckets.DeviceID) {
	nv := p[name]
	if nv == nil {
		nv = &nameValues{devices: make(map[string][]buckets.DeviceID)}
		p[name] = nv
	}
	list, known := nv.devices[value]
	if !known {
		nv.values = append(nv.values, value) // sorted by finishLoad
	}
	nv.devices[value] = append(list, dev)
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
	i, found := slices.BinarySearch(list, dev)
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

// change moves dev's postings from the attribute set old to new.
func (p attrPostings) change(dev buckets.DeviceID, old, new buckets.Attributes) {
	for _, a := range old {
		if v, ok := new.Get(a.Name); !ok || v != a.Value {
			p.remove(a.Name, a.Value, dev)
		}
	}
	for _, a := range new {
		if v, ok := old.Get(a.Name); !ok || v != a.Value {
			p.add(a.Name, a.Value, dev)
		}
	}
}

// attrChanges lists the index entity keys to write and delete when dev's
// set goes from old to new.
func attrChanges(dev buckets.DeviceID, old, new buckets.Attributes) (set, del [][]byte) {
	for _, a := range old {
		if v, ok := new.Get(a.Name); !ok || v != a.Value {
			del = append(del, entityKey(a.Name, a.Value, dev))
		}
	}
	for _, a := range new {
		if v, ok := old.Get(a.Name); !ok || v != a.Value {
			set = append(set, entityKey(a.Name, a.Value, dev))
		}
	}
	return set, del
}
