package devindex

import (
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// attrLockStripes is how many locks serialise attribute changes: one
// device always takes the same one, so changes of one device apply in
// order while different devices commit in parallel.
const attrLockStripes = 64

// attrLocks serialise the read-change-commit-apply of attribute
// changes per device.
type attrLocks [attrLockStripes]sync.Mutex

// stripes returns the sorted, distinct stripes of devs.
func stripes(devs []buckets.DeviceID) []int {
	out := make([]int, 0, len(devs))
	for _, d := range devs {
		out = append(out, int(crc32.Checksum([]byte(d), castagnoli)%attrLockStripes))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// attrChange is the new attribute record of one device.
type attrChange struct {
	dev      buckets.DeviceID
	old, new *attrRecord
}

// Assign applies attribute assignments: for every attribute of a
// device the assignment with the newest At wins, for removals and for
// the replacement of the whole set alike, so a late assignment never
// rolls a newer one back and applying one again changes nothing. At
// equal At a value beats a removal and the greater value beats the
// smaller. A device's attribute record and its index entities change in
// one transaction of the index database, which day drops never touch.
// An assignment for a device the index has not seen creates it, with
// zero FirstSeen and LastSeen until a reading arrives.
//
// Invalid assignments (see Validate, and more than
// buckets.MaxAttributes after applying) are refused with a
// *buckets.ValidationError and nothing of as is applied.
func (x *Index) Assign(as []buckets.Assignment) error {
	if err := Validate(as); err != nil {
		return err
	}
	byDev := groupAssignments(as)
	devs := make([]buckets.DeviceID, 0, len(byDev))
	for d := range byDev {
		devs = append(devs, d)
	}
	slices.Sort(devs)
	locks := stripes(devs)
	for _, i := range locks {
		x.attrLocks[i].Lock()
	}
	defer func() {
		for _, i := range locks {
			x.attrLocks[i].Unlock()
		}
	}()
	changes, err := x.planAssign(devs, byDev)
	if err != nil {
		return err
	}
	if err := x.commitAttrs(changes); err != nil {
		return fmt.Errorf("assign attributes: %w", err)
	}
	return nil
}

// Validate checks each assignment's device, time, names and values: a
// name, value or device breaking its rule, a name both set and
// removed, or more than buckets.MaxAttributes set is refused with a
// *buckets.ValidationError.
func Validate(as []buckets.Assignment) error {
	for i := range as {
		if err := validateAssignment(&as[i]); err != nil {
			return err
		}
	}
	return nil
}

// groupAssignments groups as by device, keeping their order.
func groupAssignments(as []buckets.Assignment) map[buckets.DeviceID][]*buckets.Assignment {
	m := make(map[buckets.DeviceID][]*buckets.Assignment)
	for i := range as {
		m[as[i].Device] = append(m[as[i].Device], &as[i])
	}
	return m
}

// planAssign computes the new records of devs; the caller holds their
// locks. Devices whose record does not change are left out.
func (x *Index) planAssign(devs []buckets.DeviceID, byDev map[buckets.DeviceID][]*buckets.Assignment) ([]attrChange, error) {
	changes := make([]attrChange, 0, len(devs))
	for _, d := range devs {
		x.mu.RLock()
		var old *attrRecord
		if e := x.devices[d]; e != nil {
			old = e.attrs
		}
		x.mu.RUnlock()
		r, changed := old.clone(), false
		for _, a := range byDev[d] {
			changed = r.apply(a) || changed
		}
		if len(r.set) > buckets.MaxAttributes {
			return nil, buckets.Invalid(buckets.CodeTooManyAttributes, -1, "attributes",
				"device %s would have %d attributes, at most %d are allowed", d, len(r.set), buckets.MaxAttributes)
		}
		if changed {
			changes = append(changes, attrChange{dev: d, old: old, new: r})
		}
	}
	return changes, nil
}

// validateAssignment checks a's device, time, names and values.
func validateAssignment(a *buckets.Assignment) error {
	if err := a.Device.Validate(); err != nil {
		return err
	}
	if a.At < 0 || a.At > buckets.MaxTicks {
		return buckets.Invalid(buckets.CodeInvalidTime, -1, "at", "assignment time %d is outside 0001..9999", a.At)
	}
	if len(a.Set) > buckets.MaxAttributes {
		return buckets.Invalid(buckets.CodeTooManyAttributes, -1, "attributes",
			"%d attributes, at most %d are allowed", len(a.Set), buckets.MaxAttributes)
	}
	for i, x := range a.Set {
		if err := buckets.ValidateAttributeName(x.Name); err != nil {
			return err
		}
		if err := buckets.ValidateAttributeValue(x.Name, x.Value); err != nil {
			return err
		}
		if i > 0 && a.Set[i-1].Name >= x.Name {
			return buckets.Invalid(buckets.CodeInvalidAttributeName, -1, "attributes."+x.Name,
				"attributes must be sorted by name and unique")
		}
	}
	for _, name := range a.Remove {
		if err := buckets.ValidateAttributeName(name); err != nil {
			return err
		}
		if _, ok := a.Set.Get(name); ok {
			return buckets.Invalid(buckets.CodeInvalidAttributeName, -1, "attributes."+name,
				"attribute is both set and removed")
		}
	}
	return nil
}

// commitAttrs writes changes, each device's record and entities in one
// transaction, and then applies them to memory. A batch too big for one
// transaction is split between devices; what committed is applied
// even when a later part fails.
func (x *Index) commitAttrs(changes []attrChange) error {
	for from := 0; from < len(changes); {
		n, err := x.commitLeading(changes[from:])
		if err != nil {
			return err
		}
		x.applyAttrs(changes[from : from+n])
		from += n
	}
	return nil
}

// commitLeading commits as many of the leading changes as one
// transaction holds and returns how many.
func (x *Index) commitLeading(changes []attrChange) (int, error) {
	txn := x.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	n := 0
	for ; n < len(changes); n++ {
		err := writeAttrChange(txn, &changes[n])
		if err == nil {
			continue
		}
		if !errors.Is(err, badger.ErrTxnTooBig) || n == 0 {
			return 0, err
		}
		// Part of change n went in: start again without it.
		txn.Discard()
		txn = x.db.NewTransaction(true)
		for i := range n {
			if err := writeAttrChange(txn, &changes[i]); err != nil {
				return 0, err
			}
		}
		break
	}
	return n, txn.Commit()
}

// writeAttrChange puts c's record and entity changes into txn.
func writeAttrChange(txn *badger.Txn, c *attrChange) error {
	var oldSet buckets.Attributes
	if c.old != nil {
		oldSet = c.old.set
	}
	set, del := attrChanges(c.dev, oldSet, c.new.set)
	for _, k := range del {
		if err := txn.Delete(k); err != nil {
			return err
		}
	}
	for _, k := range set {
		if err := txn.Set(k, nil); err != nil {
			return err
		}
	}
	return txn.Set(AttrRecordKey(c.dev), encodeAttrRecord(nil, c.new))
}

// applyAttrs makes committed changes visible.
func (x *Index) applyAttrs(changes []attrChange) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, c := range changes {
		e := x.entry(c.dev)
		var oldSet buckets.Attributes
		if e.attrs != nil {
			oldSet = e.attrs.set
		}
		x.postings.change(c.dev, e, oldSet, c.new.set)
		e.attrs = c.new
		if !slices.Equal(oldSet, c.new.set) {
			x.attrGen.Add(1)
		}
	}
}

// AttributeGeneration counts the changes of devices' attribute sets
// (assignments that changed a set, deleted devices): an answer made
// with the attributes of one generation is stale in the next.
func (x *Index) AttributeGeneration() uint64 { return x.attrGen.Load() }

// entry returns dev's entry, creating one without readings if the
// index has not seen dev. x.mu must be held for writing.
func (x *Index) entry(dev buckets.DeviceID) *deviceEntry {
	e := x.devices[dev]
	if e == nil {
		e = &deviceEntry{}
		x.devices[dev] = e
		i, _ := slices.BinarySearch(x.sorted, dev)
		x.sorted = slices.Insert(x.sorted, i, dev)
	}
	return e
}

// Device returns what the index knows about dev, with its attributes;
// buckets.ErrNotFound if it knows nothing.
func (x *Index) Device(dev buckets.DeviceID) (buckets.DeviceInfo, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	e := x.devices[dev]
	if e == nil {
		return buckets.DeviceInfo{}, fmt.Errorf("device %s: %w", dev, buckets.ErrNotFound)
	}
	return e.info(dev), nil
}

// info is the DeviceInfo of e; x.mu must be held.
func (e *deviceEntry) info(dev buckets.DeviceID) buckets.DeviceInfo {
	di := buckets.DeviceInfo{Device: dev, FirstSeen: e.first, LastSeen: e.last, Latest: slices.Clone(e.latest)}
	if a := e.attributes(); len(a) > 0 {
		di.Attributes = slices.Clone(a)
	}
	return di
}

// attributes is e's attribute set.
func (e *deviceEntry) attributes() buckets.Attributes {
	if e.attrs == nil {
		return nil
	}
	return e.attrs.set
}

// AttributeState returns assignments that rebuild, by Assign on another
// index, the attribute state of the devices keep selects, listed from
// the first device after after, at most limit devices: per device the
// replacement of the whole set at its floor, each value at its own time
// and each removal at its time. Assign merges them with what that
// index holds by the same rule as any assignment (the newest wins), so
// a copy taken from one owner of a partition gives another owner the
// attributes set over HTTP that it never received, without rolling
// back anything newer it has. next is the last device listed; more
// says whether devices past it remain.
func (x *Index) AttributeState(after buckets.DeviceID, limit int, keep func(buckets.DeviceID) bool) (as []buckets.Assignment, next buckets.DeviceID, more bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	i, found := slices.BinarySearch(x.sorted, after)
	if found {
		i++
	}
	n := 0
	for ; i < len(x.sorted); i++ {
		dev := x.sorted[i]
		r := x.devices[dev].attrs
		if r == nil || !keep(dev) {
			continue
		}
		if n == limit {
			return as, next, true
		}
		n++
		next = dev
		if r.floor > 0 {
			as = append(as, buckets.Assignment{Device: dev, At: r.floor, Replace: true})
		}
		for j, a := range r.set {
			as = append(as, buckets.Assignment{Device: dev, At: r.at[j], Set: buckets.Attributes{a}})
		}
		for _, g := range r.gone {
			as = append(as, buckets.Assignment{Device: dev, At: g.at, Remove: []string{g.name}})
		}
	}
	return as, next, false
}
