package buckets

import (
	"fmt"
	"time"
)

// Day is a UTC calendar day, counted from 0001-01-01 (day 0). It names
// a day table: every reading whose instant falls in that day is stored
// in it, so dropping the table drops the day.
type Day int32

// DayLayout is how a day is written in keys, paths and the API.
const DayLayout = "2006-01-02"

// DayOf returns the UTC day that k falls in.
func DayOf(k Ticks) Day { return Day(k / TicksPerDay) }

// DayOfTime returns the UTC day of t. t must be within 0001..9999.
func DayOfTime(t time.Time) Day { return DayOf(MustTicks(t)) }

// ParseDay parses YYYY-MM-DD, a day between 0001-01-01 and 9999-12-31.
func ParseDay(s string) (Day, error) {
	t, err := time.Parse(DayLayout, s)
	if err != nil {
		return 0, fmt.Errorf("cannot parse %q as a day (YYYY-MM-DD)", s)
	}
	k, err := TicksOf(t)
	if err != nil {
		return 0, fmt.Errorf("day %q is outside 0001-01-01..9999-12-31", s)
	}
	return DayOf(k), nil
}

// String renders the day as YYYY-MM-DD; it is also the table name.
func (d Day) String() string { return d.Start().Time().Format(DayLayout) }

// Start is the first tick of the day.
func (d Day) Start() Ticks { return Ticks(d) * TicksPerDay }

// End is the first tick of the next day (exclusive bound).
func (d Day) End() Ticks { return Ticks(d+1) * TicksPerDay }

// PartitionKey is the Azure-style partition key of device on day d:
// "<device>/<YYYY-MM-DD>".
func PartitionKey(device DeviceID, d Day) string { return string(device) + "/" + d.String() }
