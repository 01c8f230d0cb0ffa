package buckets

import "time"

// DeviceDelete is the outcome of deleting a device: its readings in
// every day table, its device index record (first and last seen,
// latest values) and its attributes are gone, and a tombstone keeps
// messages the stream stored before Deleted from writing them again.
type DeviceDelete struct {
	Device DeviceID
	// Deleted is when the device was deleted: the time of its
	// tombstone, by the wall clock of the node that deleted it.
	Deleted time.Time
	// Readings is how many readings were removed; -1 when not known
	// (a cluster sums its nodes' copies).
	Readings int64
	// Tables is how many day tables held readings of the device.
	Tables int
}
