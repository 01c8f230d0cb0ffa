package replay

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// DeviceTombPrefix is the key prefix of device tombstones in the index
// database. Like the attribute prefixes it sorts before every device
// record.
const DeviceTombPrefix = 0x03

// DeviceTombs are the deleted devices and when each was deleted, kept
// in the device index database. The zero value is empty.
type DeviceTombs struct {
	mu sync.RWMutex
	at map[buckets.DeviceID]time.Time
}

// deviceTombKey is the key of dev's tombstone.
func deviceTombKey(dev buckets.DeviceID) []byte {
	return append([]byte{DeviceTombPrefix}, dev...)
}

// Load reads the device tombstones of the index database db (at
// Open), removing those older than TombstoneKeep unless readOnly; log
// warns of malformed ones.
func (d *DeviceTombs) Load(db *badger.DB, readOnly bool, log *slog.Logger) error {
	tombs := map[buckets.DeviceID]time.Time{}
	var expired [][]byte
	err := db.View(func(txn *badger.Txn) error {
		it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte{DeviceTombPrefix}})
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			dev := buckets.DeviceID(item.Key()[1:])
			err := item.Value(func(v []byte) error {
				if len(v) != 8 || dev.Validate() != nil {
					log.Warn("ignoring a malformed device tombstone", "key", fmt.Sprintf("%q", item.Key()))
					return nil
				}
				at := time.Unix(0, int64(binary.BigEndian.Uint64(v)))
				if time.Since(at) >= TombstoneKeep {
					expired = append(expired, item.KeyCopy(nil))
					return nil
				}
				tombs[buckets.DeviceID(string(dev))] = at
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read device tombstones: %w", err)
	}
	if len(expired) > 0 && !readOnly {
		wb := db.NewWriteBatch()
		defer wb.Cancel()
		for _, k := range expired {
			if err := wb.Delete(k); err != nil {
				return fmt.Errorf("remove expired device tombstones: %w", err)
			}
		}
		if err := wb.Flush(); err != nil {
			return fmt.Errorf("remove expired device tombstones: %w", err)
		}
	}
	d.mu.Lock()
	d.at = tombs
	d.mu.Unlock()
	return nil
}

// Save durably records in db that dev was deleted at at.
func (d *DeviceTombs) Save(db *badger.DB, dev buckets.DeviceID, at time.Time) error {
	err := db.Update(func(txn *badger.Txn) error {
		return txn.Set(deviceTombKey(dev), binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano())))
	})
	if err == nil {
		err = db.Sync()
	}
	if err != nil {
		return err
	}
	d.mu.Lock()
	if d.at == nil {
		d.at = map[buckets.DeviceID]time.Time{}
	}
	d.at[dev] = at
	d.mu.Unlock()
	return nil
}

// At reports when dev was last deleted, if within the time tombstones
// are kept.
func (d *DeviceTombs) At(dev buckets.DeviceID) (time.Time, bool) {
	d.mu.RLock()
	at, ok := d.at[dev]
	d.mu.RUnlock()
	return at, ok
}
