package buckets

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Ticks counts 100 ns intervals since 0001-01-01T00:00:00Z, like .NET
// DateTime.Ticks. The identity of a reading is (device, ticks), so two
// timestamps less than 100 ns apart name the same reading.
type Ticks int64

const (
	// TicksPerSecond is the number of ticks in one second.
	TicksPerSecond = 10_000_000
	// TicksPerDay is the number of ticks in one day.
	TicksPerDay = 86_400 * TicksPerSecond
	// MaxTicks is DateTime.MaxValue.Ticks: 9999-12-31T23:59:59.9999999Z.
	MaxTicks Ticks = 3155378975999999999
	// unixEpochTicks is the tick count of 1970-01-01T00:00:00Z.
	unixEpochTicks Ticks = 621355968000000000
	// RowKeyLen is the length of a row key: 19 zero-padded digits.
	RowKeyLen = 19
)

// minTime is the first representable instant; endTime is the first
// instant past the range (every instant before it truncates to at most
// MaxTicks).
var (
	minTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	endTime = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
)

// TicksOf converts t to ticks, truncating to 100 ns. It fails when t
// lies outside 0001-01-01 .. 9999-12-31 rather than wrapping.
func TicksOf(t time.Time) (Ticks, error) {
	if t.Before(minTime) || !t.Before(endTime) {
		return 0, fmt.Errorf("%s is outside 0001-01-01..9999-12-31", t.UTC().Format(time.RFC3339Nano))
	}
	sec := t.Unix() + int64(unixEpochTicks/TicksPerSecond)
	return Ticks(sec*TicksPerSecond + int64(t.Nanosecond()/100)), nil
}

// MustTicks is TicksOf for instants known to be in range (clocks,
// constants). It panics otherwise.
func MustTicks(t time.Time) Ticks {
	k, err := TicksOf(t)
	if err != nil {
		panic(err)
	}
	return k
}

// Time returns the UTC instant of k.
func (k Ticks) Time() time.Time {
	sec := int64(k/TicksPerSecond) - int64(unixEpochTicks/TicksPerSecond)
	return time.Unix(sec, int64(k%TicksPerSecond)*100).UTC()
}

// Valid reports whether k names an instant between 0001 and 9999.
func (k Ticks) Valid() bool { return k >= 0 && k <= MaxTicks }

// Inverted returns MaxTicks - k: newer instants get smaller values, so
// a forward scan returns the newest first (the log-tail pattern).
func (k Ticks) Inverted() uint64 { return uint64(MaxTicks - k) }

// TicksFromInverted undoes Inverted.
func TicksFromInverted(inv uint64) Ticks { return MaxTicks - Ticks(inv) }

// RowKey is the row key of a reading at k: the inverted ticks as a
// 19-digit zero-padded decimal string.
func (k Ticks) RowKey() string {
	var b [RowKeyLen]byte
	v := k.Inverted()
	for i := RowKeyLen - 1; i >= 0; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
	return string(b[:])
}

// ParseRowKey is the inverse of RowKey.
func ParseRowKey(s string) (Ticks, error) {
	if len(s) != RowKeyLen {
		return 0, fmt.Errorf("row key %q: want %d digits", s, RowKeyLen)
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > uint64(MaxTicks) {
		return 0, fmt.Errorf("row key %q: not an inverted tick count", s)
	}
	return TicksFromInverted(v), nil
}

// Epoch milliseconds that stay inside the representable range.
const (
	minEpochMillis = -62135596800000
	maxEpochMillis = 253402300799999
)

// TicksFromEpochMillis converts Unix epoch milliseconds to ticks,
// refusing values that would overflow.
func TicksFromEpochMillis(ms int64) (Ticks, error) {
	if ms < minEpochMillis || ms > maxEpochMillis {
		return 0, fmt.Errorf("epoch milliseconds %d is outside 0001-01-01..9999-12-31", ms)
	}
	return unixEpochTicks + Ticks(ms)*10_000, nil
}

// ParseTime parses s as RFC 3339 (any fraction, any offset) or as
// Unix epoch milliseconds (an optionally signed run of digits).
func ParseTime(s string) (Ticks, error) {
	if s != "" && isInteger(s) {
		ms, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cannot parse %q as epoch milliseconds: out of range", s)
		}
		return TicksFromEpochMillis(ms)
	}
	// RFC 3339 (section 5.6) allows the "T" and "Z" in lower case; Go's
	// layout wants them upper case. No other letter can appear.
	t, err := time.Parse(time.RFC3339Nano, strings.Map(upperTZ, s))
	if err != nil {
		return 0, fmt.Errorf("cannot parse %q as RFC 3339 or epoch milliseconds", s)
	}
	return TicksOf(t)
}

func upperTZ(r rune) rune {
	if r == 't' || r == 'z' {
		return r - 'a' + 'A'
	}
	return r
}

func isInteger(s string) bool {
	s = strings.TrimPrefix(s, "-")
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// FormatTime renders k as RFC 3339 with nanoseconds in UTC, the form
// every API response uses.
func (k Ticks) FormatTime() string { return k.Time().Format(time.RFC3339Nano) }
