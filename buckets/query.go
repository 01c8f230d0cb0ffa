package buckets

import "time"

// Order is the direction of a range query.
type Order uint8

// Orders. Desc (newest first) is the natural order of the row key.
const (
	Desc Order = iota
	Asc
)

// String returns "desc" or "asc".
func (o Order) String() string {
	if o == Asc {
		return "asc"
	}
	return "desc"
}

// RangeQuery asks for the readings of one device with From <= ticks <
// To, in Order, at most Limit of them. When After is set the query
// resumes behind that position: in Desc order it returns only readings
// older than *After, in Asc order only newer ones.
type RangeQuery struct {
	Device DeviceID
	From   Ticks // inclusive
	To     Ticks // exclusive
	Order  Order
	Limit  int
	After  *Ticks
}

// Page is one page of a range query. More is true when at least one
// more reading matched the query beyond the last one returned.
type Page struct {
	Readings []Reading
	More     bool
}

// DeviceInfo is what the device index knows about one device.
type DeviceInfo struct {
	Device    DeviceID
	FirstSeen Ticks
	LastSeen  Ticks
	// Latest holds the newest value of every name the device has sent,
	// sorted by name.
	Latest []Field
	// Attributes is the device's attribute set.
	Attributes Attributes
}

// TableInfo describes one day table.
type TableInfo struct {
	Day       Day
	SizeBytes int64
	// Readings is the number of distinct readings in the table, or -1
	// when it is not known without a scan.
	Readings int64
}

// TableDrop reports one table that retention dropped or would drop.
type TableDrop struct {
	Day       Day
	SizeBytes int64
	Readings  int64  // -1 when not known
	Reason    string // "expired", "size_limit" or "manual"
}

// RetentionReport is the outcome of one retention run.
type RetentionReport struct {
	DryRun   bool
	Started  time.Time
	Cutoff   time.Time   // tables whose day ends at or before this expire
	Dropped  []TableDrop // what was (or, on a dry run, would be) dropped
	Kept     int         // tables left in place
	BytesNow int64       // total table size after the run
}
