package buckets

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Kind is the type of a Value.
type Kind uint8

// Value kinds. The zero Kind is invalid.
const (
	KindFloat Kind = iota + 1
	KindInt
	KindBool
	KindString
)

// String names the kind as the API documents it.
func (k Kind) String() string {
	switch k {
	case KindFloat:
		return "float"
	case KindInt:
		return "int"
	case KindBool:
		return "bool"
	case KindString:
		return "string"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Value is one typed measurement: a float64, an int64, a bool or a
// string of at most MaxStringLen bytes.
type Value struct {
	Kind Kind
	num  uint64 // float64 bits, int64 bits, or 0/1 for bool
	str  string
}

// Float returns a float64 value.
func Float(f float64) Value { return Value{Kind: KindFloat, num: math.Float64bits(f)} }

// Int returns an int64 value.
func Int(i int64) Value { return Value{Kind: KindInt, num: uint64(i)} }

// Bool returns a bool value.
func Bool(b bool) Value {
	v := Value{Kind: KindBool}
	if b {
		v.num = 1
	}
	return v
}

// String returns a string value.
func String(s string) Value { return Value{Kind: KindString, str: s} }

// AsFloat returns the float64 of a KindFloat value.
func (v Value) AsFloat() float64 { return math.Float64frombits(v.num) }

// AsInt returns the int64 of a KindInt value.
func (v Value) AsInt() int64 { return int64(v.num) }

// AsBool returns the bool of a KindBool value.
func (v Value) AsBool() bool { return v.num != 0 }

// AsString returns the string of a KindString value.
func (v Value) AsString() string { return v.str }

// Any returns the value as float64, int64, bool or string.
func (v Value) Any() any {
	switch v.Kind {
	case KindFloat:
		return v.AsFloat()
	case KindInt:
		return v.AsInt()
	case KindBool:
		return v.AsBool()
	case KindString:
		return v.str
	}
	return nil
}

// Validate checks the value against the data model: a known kind, no
// NaN or ±Inf, strings at most MaxStringLen bytes.
func (v Value) Validate() error {
	switch v.Kind {
	case KindFloat:
		if f := v.AsFloat(); math.IsNaN(f) || math.IsInf(f, 0) {
			return invalid(CodeInvalidValue, "", "%v is not a finite number", f)
		}
	case KindInt, KindBool:
	case KindString:
		if len(v.str) > MaxStringLen {
			return invalid(CodeStringTooLong, "", "string of %d bytes is longer than %d", len(v.str), MaxStringLen)
		}
	default:
		return invalid(CodeInvalidValue, "", "unknown value kind %d", v.Kind)
	}
	return nil
}

// Field is one named value of a reading.
type Field struct {
	Name  string
	Value Value
}

// Reading is what one device measured at one instant. Values are kept
// sorted by name (see SortValues); a name appears at most once.
type Reading struct {
	Device DeviceID
	Ticks  Ticks
	Values []Field
}

// Day is the day table the reading belongs to.
func (r *Reading) Day() Day { return DayOf(r.Ticks) }

// PartitionKey is "<device>/<YYYY-MM-DD>".
func (r *Reading) PartitionKey() string { return PartitionKey(r.Device, r.Day()) }

// RowKey is the 19-digit inverted-ticks string.
func (r *Reading) RowKey() string { return r.Ticks.RowKey() }

// Get returns the value named name.
func (r *Reading) Get(name string) (Value, bool) {
	i, ok := slices.BinarySearchFunc(r.Values, name, compareFieldName)
	if !ok {
		return Value{}, false
	}
	return r.Values[i].Value, true
}

func compareFieldName(f Field, name string) int { return strings.Compare(f.Name, name) }

// SortValues sorts fields by name in place and reports the first name
// that appears twice, if any.
func SortValues(fields []Field) (dup string, ok bool) {
	slices.SortStableFunc(fields, func(a, b Field) int { return strings.Compare(a.Name, b.Name) })
	for i := 1; i < len(fields); i++ {
		if fields[i].Name == fields[i-1].Name {
			return fields[i].Name, false
		}
	}
	return "", true
}

// Validate checks everything about r but the time window: device ID,
// 1..MaxValues values, value names, value contents, sorted unique
// names. The error is a *ValidationError naming the field.
func (r *Reading) Validate() error { return r.ValidateAfter(nil) }

// ValidateAfter is Validate for a reading checked right after prev,
// which passed Validate: a device ID or value name equal to prev's (at
// the same position) is not checked again. Readings in a batch mostly
// repeat their device and names, and checking a name costs more than
// comparing it.
func (r *Reading) ValidateAfter(prev *Reading) error {
	if prev == nil || r.Device != prev.Device {
		if err := r.Device.Validate(); err != nil {
			return err
		}
	}
	if !r.Ticks.Valid() {
		return invalid(CodeInvalidTime, "ts", "tick count %d is outside 0001..9999", int64(r.Ticks))
	}
	switch n := len(r.Values); {
	case n == 0:
		return invalid(CodeNoValues, "values", "a reading needs at least one value")
	case n > MaxValues:
		return invalid(CodeTooManyValues, "values", "%d values is more than %d", n, MaxValues)
	}
	for i, f := range r.Values {
		if prev == nil || i >= len(prev.Values) || prev.Values[i].Name != f.Name {
			if err := ValidateValueName(f.Name); err != nil {
				return err
			}
		}
		if i > 0 && r.Values[i-1].Name >= f.Name {
			return invalid(CodeDuplicateValue, "values."+f.Name, "value names must be unique (and sorted)")
		}
		if err := f.Value.Validate(); err != nil {
			ve := err.(*ValidationError)
			ve.Field = "values." + f.Name
			return ve
		}
	}
	return nil
}

// Merge returns the union of old and upd, both sorted by name; where a
// name is in both, upd's value wins. This is the InsertOrMerge rule for
// two readings with the same device and ticks.
func Merge(old, upd []Field) []Field {
	out := make([]Field, 0, len(old)+len(upd))
	i, j := 0, 0
	for i < len(old) && j < len(upd) {
		switch c := strings.Compare(old[i].Name, upd[j].Name); {
		case c < 0:
			out = append(out, old[i])
			i++
		case c > 0:
			out = append(out, upd[j])
			j++
		default:
			out = append(out, upd[j])
			i++
			j++
		}
	}
	out = append(out, old[i:]...)
	return append(out, upd[j:]...)
}

// Defaults of the accepted window (store/README.md and retention/README.md). Every package and
// the service's flags take these; nothing else spells them out.
const (
	// DefaultRetention is how long readings are kept: 30 days.
	DefaultRetention = 720 * time.Hour
	// DefaultMaxFutureSkew is how far ahead of the clock a reading may be.
	DefaultMaxFutureSkew = 5 * time.Minute
)

// DefaultWindow is the accepted window with both defaults.
var DefaultWindow = Window{Retention: DefaultRetention, MaxFutureSkew: DefaultMaxFutureSkew}

// Window is the accepted time window of ingest: readings must be no
// older than now - Retention and no newer than now + MaxFutureSkew.
type Window struct {
	Retention     time.Duration
	MaxFutureSkew time.Duration
}

// Check reports whether k is inside the window at now. The error is a
// *ValidationError with code too_old or too_far_in_future.
func (w Window) Check(k Ticks, now time.Time) error {
	t := k.Time()
	// Compare at tick resolution: the tick that holds now - Retention
	// is still inside the window even when now has finer precision.
	if oldest := now.Add(-w.Retention).Truncate(100 * time.Nanosecond); t.Before(oldest) {
		return invalid(CodeTooOld, "ts", "%s is older than the retention window (oldest accepted %s)",
			k.FormatTime(), oldest.UTC().Format(time.RFC3339Nano))
	}
	if newest := now.Add(w.MaxFutureSkew); t.After(newest) {
		return invalid(CodeTooFarInFuture, "ts", "%s is more than %s in the future (newest accepted %s)",
			k.FormatTime(), w.MaxFutureSkew, newest.UTC().Format(time.RFC3339Nano))
	}
	return nil
}
