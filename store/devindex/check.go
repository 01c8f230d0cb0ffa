package devindex

import (
	"fmt"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// CheckResult is what Check found in the index database.
type CheckResult struct {
	// RecordsRead counts the device records read.
	RecordsRead int
	// Bad are the device records and attribute records that failed
	// their checksum or their decoding, device records first.
	Bad []Damaged
	// AttributeRecordsRead and EntitiesRead count the attribute records
	// and the attribute index entities read. MissingEntities counts the
	// entities a record holds that were not found, StrayEntities those
	// found that no record holds.
	AttributeRecordsRead, EntitiesRead, MissingEntities, StrayEntities int
}

// Check decodes every device record and attribute record of the
// database, checking each checksum, and compares the index entities
// with the attribute records. What it found before an error is in the
// result too.
func (x *Index) Check() (CheckResult, error) {
	var res CheckResult
	if err := x.checkRecords(&res); err != nil {
		return res, err
	}
	return res, x.checkAttributes(&res)
}

// checkRecords decodes every device record of the database into res.
func (x *Index) checkRecords(res *CheckResult) error {
	err := x.db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{})
		defer it.Close()
		for it.Seek(deviceKeysStart); it.Valid(); it.Next() {
			res.RecordsRead++
			err := it.Item().Value(func(v []byte) error {
				_, err := decodeEntry(v)
				return err
			})
			if err != nil {
				res.Bad = append(res.Bad, Damaged{Device: buckets.DeviceID(it.Item().KeyCopy(nil)), Err: err})
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("check device index: %w", err)
	}
	return nil
}

// checkAttributes decodes every attribute record of the database and
// compares the index entities with them, into res.
func (x *Index) checkAttributes(res *CheckResult) error {
	records := make(map[buckets.DeviceID]*attrRecord)
	damaged := make(map[buckets.DeviceID]bool)
	err := x.db.View(func(txn *badger.Txn) error {
		err := forEachAttrRecord(txn, func(dev buckets.DeviceID, r *attrRecord, err error) {
			res.AttributeRecordsRead++
			if err != nil {
				res.Bad = append(res.Bad, Damaged{Device: dev, Err: fmt.Errorf("attribute record: %w", err)})
				damaged[dev] = true
				return
			}
			records[dev] = r
		})
		if err != nil {
			return err
		}
		t := tallyEntities(txn, func(d buckets.DeviceID) *attrRecord { return records[d] },
			func(dev buckets.DeviceID, _, _ string) bool { return damaged[dev] })
		expected := 0
		for _, r := range records {
			expected += len(r.set)
		}
		res.EntitiesRead = t.read
		res.MissingEntities = t.missing(expected)
		res.StrayEntities = len(t.stray)
		return nil
	})
	if err != nil {
		return fmt.Errorf("check device attributes: %w", err)
	}
	return nil
}
