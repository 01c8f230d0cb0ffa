package main

import (
	"math"
	"strconv"
	"time"
)

// shape is the JSON form of one reading (ingest/README.md).
type shape uint8

const (
	shapeNested shape = iota // {"ts": ..., "values": {"temp": 21.5}}
	shapeFlat                // {"ts": ..., "temp": 21.5}
)

// tsForm is how a reading's timestamp is written.
type tsForm uint8

const (
	tsRFC3339     tsForm = iota // "2026-11-22T01:02:03.456Z"
	tsEpochMillis               // 1795309323456
)

// RFC 3339 in UTC with three or six fraction digits.
const (
	rfc3339Millis = "2006-01-02T15:04:05.000Z"
	rfc3339Micros = "2006-01-02T15:04:05.000000Z"
)

// payloadFormat selects the shape and timestamp form of payloads.
type payloadFormat struct {
	shape shape
	ts    tsForm
}

// reading is one simulated reading before it is encoded: a timestamp
// in epoch microseconds and one value per name of the fleet.
type reading struct {
	us   int64
	vals []float64
}

// appendPayload appends the JSON payload of readings to dst: a single
// object for one reading, an array for more. names holds the value
// names, in the order of each reading's vals; they must be valid value
// names (buckets.ValidateValueName), which never need JSON escaping.
func appendPayload(dst []byte, pf payloadFormat, names []string, readings []reading) []byte {
	if len(readings) == 1 {
		return appendReading(dst, pf, names, readings[0])
	}
	dst = append(dst, '[')
	for i, r := range readings {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendReading(dst, pf, names, r)
	}
	return append(dst, ']')
}

// appendReading appends one reading as a JSON object.
func appendReading(dst []byte, pf payloadFormat, names []string, r reading) []byte {
	dst = append(dst, `{"ts":`...)
	dst = appendTS(dst, pf.ts, r.us)
	if pf.shape == shapeNested {
		dst = append(dst, `,"values":{`...)
		dst = appendValues(dst, names, r.vals)
		return append(dst, "}}"...)
	}
	dst = append(dst, ',')
	dst = appendValues(dst, names, r.vals)
	return append(dst, '}')
}

// appendValues appends "name":value pairs separated by commas.
func appendValues(dst []byte, names []string, vals []float64) []byte {
	for i, v := range vals {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, '"')
		dst = append(dst, names[i]...)
		dst = append(dst, `":`...)
		dst = appendNumber(dst, v)
	}
	return dst
}

// appendNumber writes v as a JSON number in its shortest form. The
// signal generators never produce NaN or ±Inf; if one slipped through
// it is written as 0 rather than as invalid JSON.
func appendNumber(dst []byte, v float64) []byte {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		v = 0
	}
	return strconv.AppendFloat(dst, v, 'f', -1, 64)
}

// appendTS appends a timestamp given in epoch microseconds: epoch
// milliseconds (truncated), or RFC 3339 with milliseconds, or with
// microseconds when the instant is not a whole millisecond.
func appendTS(dst []byte, form tsForm, us int64) []byte {
	if form == tsEpochMillis {
		return strconv.AppendInt(dst, us/1000, 10)
	}
	layout := rfc3339Millis
	if us%1000 != 0 {
		layout = rfc3339Micros
	}
	dst = append(dst, '"')
	dst = time.UnixMicro(us).UTC().AppendFormat(dst, layout)
	return append(dst, '"')
}

// round2 rounds v to two decimals, the precision a real sensor reports.
func round2(v float64) float64 { return math.Round(v*100) / 100 }
