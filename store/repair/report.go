package repair

import (
	"fmt"

	"github.com/telemetryd/telemetryd/buckets"
)

// What a check of a whole store (the store's Check) finds: the blocks
// and device index records that fail their checksum or do not decode,
// the attribute index entities that disagree with their records, and
// the day tables that could not be read.

// CheckReport is what Check found.
type CheckReport struct {
	// Tables, BlocksRead and RecordsRead count what was read.
	Tables, BlocksRead, RecordsRead int
	// Blocks are the corrupt blocks, by day and key.
	Blocks []BadBlock
	// Records are the corrupt device index records, attribute records
	// included.
	Records []BadRecord
	// AttributeRecordsRead and EntitiesRead count the attribute records
	// and the attribute index entities read. MissingEntities counts the
	// entities a record holds that were not found, StrayEntities those
	// found that no record holds.
	AttributeRecordsRead, EntitiesRead, MissingEntities, StrayEntities int
	// TableErrors are the day tables that could not be read at all.
	TableErrors []error
}

// Clean reports whether nothing corrupt or unreadable was found.
func (r CheckReport) Clean() bool {
	return len(r.Blocks) == 0 && len(r.Records) == 0 && len(r.TableErrors) == 0 &&
		r.MissingEntities == 0 && r.StrayEntities == 0
}

// BadRecord is a device index record that failed its checksum or its
// decoding.
type BadRecord struct {
	Device buckets.DeviceID
	Err    error
}

// BadBlock is a stored block that failed its checksum or its decoding.
type BadBlock struct {
	Day    buckets.Day
	Device buckets.DeviceID
	// Key is the block's Badger key in the day table.
	Key []byte
	// Oldest and Newest are the times its key says it covers.
	Oldest, Newest buckets.Ticks
	Err            error
}

// String names the block: day, device, key and time span.
func (b BadBlock) String() string {
	return fmt.Sprintf("day %s device %s key %x (readings %s..%s)", b.Day, b.Device, b.Key,
		b.Oldest.FormatTime(), b.Newest.FormatTime())
}
