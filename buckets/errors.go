package buckets

import (
	"fmt"
	"strconv"
)

// Code is a stable, machine-readable reason why a reading or payload
// was rejected. It travels in the Telemetry-Error-Code header of dead
// letters and as the "code" attribute of rejection metrics.
type Code string

// Rejection codes.
const (
	CodeInvalidPayload  Code = "invalid_payload"   // not JSON, or not one of the accepted shapes
	CodeInvalidDevice   Code = "invalid_device"    // device ID breaks the charset or length rule
	CodeDeviceMismatch  Code = "device_mismatch"   // payload device differs from the subject's
	CodeInvalidTime     Code = "invalid_timestamp" // ts unparsable or outside 0001..9999
	CodeTooOld          Code = "too_old"           // older than now - retention
	CodeTooFarInFuture  Code = "too_far_in_future" // newer than now + max future skew
	CodeNoValues        Code = "no_values"         // a reading without any value
	CodeTooManyValues   Code = "too_many_values"   // more than MaxValues values
	CodeInvalidName     Code = "invalid_value_name"
	CodeInvalidValue    Code = "invalid_value" // null, nested object, array, NaN, ±Inf
	CodeStringTooLong   Code = "string_too_long"
	CodeEmptyBatch      Code = "empty_batch"
	CodeBatchTooLarge   Code = "batch_too_large"
	CodeMaxDeliveries   Code = "max_deliveries" // the store kept failing; set aside as poison
	CodeDuplicateValue  Code = "duplicate_value_name"
	CodeInternalFailure Code = "internal"
	// CodeDayDropped: the reading's day table was dropped after the
	// message was published (a replay after the drop). Such readings are
	// skipped and counted, not dead-lettered: the operator deleted them.
	CodeDayDropped Code = "day_dropped"
	// CodeDeviceDeleted: the reading's device was deleted after the
	// stream stored its message (a replay); the reading is skipped,
	// not written.
	CodeDeviceDeleted Code = "device_deleted"
)

// ValidationError says which rule a reading broke and where. Its
// message names the reading index (when the payload is a batch) and
// the field, for example `reading 3: values.temp: NaN is not a number`.
type ValidationError struct {
	Code  Code   // the rule that was broken
	Index int    // index of the reading in its message; -1 when not applicable
	Field string // the field at fault ("ts", "device", "values.temp"); may be empty
	Msg   string // human-readable detail
}

// Error implements error.
func (e *ValidationError) Error() string {
	s := ""
	if e.Index >= 0 {
		s = "reading " + strconv.Itoa(e.Index) + ": "
	}
	if e.Field != "" {
		s += e.Field + ": "
	}
	return s + e.Msg
}

// Unwrap makes every ValidationError match ErrInvalidReading.
func (e *ValidationError) Unwrap() error { return ErrInvalidReading }

// invalid builds a ValidationError for a single reading (index -1; the
// caller that knows the index sets it).
func invalid(code Code, field, format string, args ...any) *ValidationError {
	return &ValidationError{Code: code, Index: -1, Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Invalid builds a ValidationError. Index is -1 when the error is not
// about one reading of a batch.
func Invalid(code Code, index int, field, format string, args ...any) *ValidationError {
	e := invalid(code, field, format, args...)
	e.Index = index
	return e
}
