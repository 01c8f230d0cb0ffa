package devindex

import (
	"log/slog"
	"slices"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// entityTally is what a pass over the index entities found, compared
// with the attribute records.
type entityTally struct {
	read    int      // entities read
	matched int      // entities a record holds
	stray   [][]byte // keys of entities no record holds
}

// missing is how many entities the records expect that were not found.
func (t *entityTally) missing(expected int) int { return expected - t.matched }

// tallyEntities reads every index entity and compares it with
// recordOf. An entity whose device is in claim (devices whose record
// is damaged) is handed to claim instead.
func tallyEntities(txn *badger.Txn, recordOf func(buckets.DeviceID) *attrRecord,
	claim func(dev buckets.DeviceID, name, value string) bool) entityTally {
	var t entityTally
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{attrEntityPrefix}})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		t.read++
		name, value, dev, ok := parseEntityKey(it.Item().Key())
		if ok && claim != nil && claim(dev, name, value) {
			t.matched++
			continue
		}
		if ok {
			if r := recordOf(dev); r != nil {
				if v, has := r.set.Get(name); has && v == value {
					t.matched++
					continue
				}
			}
		}
		t.stray = append(t.stray, it.Item().KeyCopy(nil))
	}
	return t
}

// forEachAttrRecord calls fn with every attribute record of the
// database, decoded, or with the decoding error.
func forEachAttrRecord(txn *badger.Txn, fn func(dev buckets.DeviceID, r *attrRecord, err error)) error {
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{attrRecordPrefix}})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		dev := buckets.DeviceID(it.Item().Key()[1:])
		err := it.Item().Value(func(v []byte) error {
			r, err := decodeAttrRecord(v)
			fn(dev, r, err)
			return nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// loadAttributes reads the attribute records into the index, rebuilds
// the postings from them and compares the index entities with them. A
// damaged record is rebuilt from its device's entities: the values
// survive, their times are lost (so the next assignment of each name
// wins). When the entities disagree with the records, a writable index
// rewrites them from the records.
func (x *Index) loadAttributes(readOnly bool, log *slog.Logger) error {
	records := make(map[buckets.DeviceID]*attrRecord)
	recovered := make(map[buckets.DeviceID]*attrRecord)
	var tally entityTally
	err := x.db.View(func(txn *badger.Txn) error {
		err := forEachAttrRecord(txn, func(dev buckets.DeviceID, r *attrRecord, err error) {
			if err != nil {
				x.attrDamaged = append(x.attrDamaged, Damaged{Device: dev, Err: err})
				recovered[dev] = &attrRecord{}
				return
			}
			records[dev] = r
		})
		if err != nil {
			return err
		}
		tally = tallyEntities(txn, func(d buckets.DeviceID) *attrRecord { return records[d] },
			func(dev buckets.DeviceID, name, value string) bool {
				r := recovered[dev]
				if r == nil {
					return false
				}
				if _, has := r.set.Get(name); has || len(r.set) < buckets.MaxAttributes {
					r.setValue(name, value, 0)
				}
				return true
			})
		return nil
	})
	if err != nil {
		return err
	}
	expected := 0
	for d, r := range recovered {
		records[d] = r
	}
	for _, r := range records {
		expected += len(r.set)
	}
	x.installAttrs(records)
	for _, d := range x.attrDamaged {
		log.Error("device attribute record is corrupt; rebuilt from the device's index entities (their assignment times are lost)",
			"device", string(d.Device), "err", d.Err)
	}
	if len(tally.stray) == 0 && tally.missing(expected) == 0 && len(recovered) == 0 || readOnly {
		return nil
	}
	log.Warn("device attribute index entities disagree with the attribute records; rewriting them from the records",
		"missing", tally.missing(expected), "stray", len(tally.stray), "corrupt_records", len(recovered))
	return x.rewriteEntities(records, recovered, tally.stray)
}

// installAttrs sets the attribute records of the index and builds the
// postings, in device order so every list is built by appending.
func (x *Index) installAttrs(records map[buckets.DeviceID]*attrRecord) {
	x.mu.Lock()
	defer x.mu.Unlock()
	added := false
	for d, r := range records {
		if e := x.devices[d]; e != nil {
			e.attrs = r
			continue
		}
		x.devices[d] = &deviceEntry{attrs: r}
		x.sorted = append(x.sorted, d)
		added = true
	}
	if added {
		slices.Sort(x.sorted)
	}
	x.postings = make(attrPostings)
	for _, d := range x.sorted {
		e := x.devices[d]
		if e.attrs != nil {
			for _, a := range e.attrs.set {
				x.postings.appendSorted(a.Name, a.Value, d, e)
			}
		}
	}
	x.postings.finishLoad()
}

// rewriteEntities deletes the stray entities, writes every entity the
// records hold and the recovered records.
func (x *Index) rewriteEntities(records, recovered map[buckets.DeviceID]*attrRecord, stray [][]byte) error {
	wb := x.db.NewWriteBatch()
	defer wb.Cancel()
	for _, k := range stray {
		if err := wb.Delete(k); err != nil {
			return err
		}
	}
	for d, r := range records {
		for _, a := range r.set {
			if err := wb.Set(EntityKey(a.Name, a.Value, d), nil); err != nil {
				return err
			}
		}
	}
	for d, r := range recovered {
		if err := wb.Set(AttrRecordKey(d), encodeAttrRecord(nil, r)); err != nil {
			return err
		}
	}
	return wb.Flush()
}
