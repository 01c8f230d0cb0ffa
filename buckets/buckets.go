// Package buckets holds the domain of the telemetry service: devices,
// readings and their values, the accepted time window, and the Azure
// Table Storage style key design (partition key device/day, row key =
// inverted ticks, one table per UTC day).
//
// It does no I/O and imports only the standard library (a layout test
// in cmd/telemetryd holds this). Every other package meets through the
// types declared here. Its sub-packages are what more than one package
// speaks, pure data and encodings without I/O either: buckets/wire (the
// binary payload of a device's readings in a message) and
// buckets/linemsg (what a line protocol write becomes: the messages
// the HTTP write endpoints in api hand to the publisher in ingest; the
// mapping itself, with its parser, is ingest/lineproto). The store's
// formats on disk are private to package store.
package buckets

import "errors"

// Limits of the data model (store/README.md and ingest/README.md).
const (
	// MaxDeviceIDLen is the longest accepted device ID.
	MaxDeviceIDLen = 64
	// MaxValueNameLen is the longest accepted value name.
	MaxValueNameLen = 64
	// MaxValues is the most named values one reading may carry (the
	// Azure entity property limit).
	MaxValues = 252
	// MaxStringLen is the longest accepted string value, in bytes.
	MaxStringLen = 4096
	// MaxBatch is the most readings one message may carry.
	MaxBatch = 10000
)

// Sentinel errors. Callers test with errors.Is; the API maps them to
// HTTP status codes in one place.
var (
	// ErrInvalidReading marks a reading or payload that breaks a rule of
	// the data model. It is permanent: retrying cannot help.
	ErrInvalidReading = errors.New("invalid reading")
	// ErrInvalidArgument marks a bad query parameter.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrNotFound marks a reading, device or table that does not exist.
	ErrNotFound = errors.New("not found")
	// ErrUnavailable marks a transient condition (a table being
	// dropped, a damaged table, a store that is closing). Retrying
	// later may succeed.
	ErrUnavailable = errors.New("unavailable")
)

// TableError reports that one day table cannot serve (damaged files, or
// the table is being dropped). It matches ErrUnavailable. ClientMessage
// is safe to show to clients: it names the day and a short reason,
// never file paths or storage internals; Error adds the cause, for logs.
type TableError struct {
	Day    Day
	Reason string // short and client-safe, e.g. "damaged; other days are unaffected"
	Err    error  // the cause, for logs
}

// Error implements error.
func (e *TableError) Error() string {
	if e.Err == nil {
		return e.ClientMessage()
	}
	return e.ClientMessage() + ": " + e.Err.Error()
}

// ClientMessage is the error without its cause.
func (e *TableError) ClientMessage() string { return "table " + e.Day.String() + ": " + e.Reason }

// Unwrap lets errors.Is match ErrUnavailable and the cause.
func (e *TableError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }
