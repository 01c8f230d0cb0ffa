// Package linemsg is what a write in InfluxDB line protocol becomes,
// shared by the HTTP door that takes the write (api), the publisher
// that stores it (ingest) and the mapper that makes it
// (ingest/lineproto): the mapping's Options, the Messages to publish
// and the rejected lines of a Result. It is data only, with no parser,
// so that api and ingest meet here without importing each other or the
// line protocol parser.
package linemsg

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// CodeDeviceNotAllowed rejects a line whose device the writer may not
// write (Options.Allow). Such a line gets no dead letter: it is a
// refused request, not bad device data.
const CodeDeviceNotAllowed buckets.Code = "device_not_allowed"

// DefaultMaxMessageBytes bounds the payload of one published message
// when Options.MaxMessageBytes is zero (NATS's default max payload).
const DefaultMaxMessageBytes = 1 << 20

// TagMode says what the tags of a line other than its device tag
// become.
type TagMode int

// Tag modes.
const (
	// TagsAsAttributes makes each tag an attribute of the line's device
	// as of the line's time.
	TagsAsAttributes TagMode = iota
	// TagsAsValues makes each tag the string value
	// <measurement><sep><tag> of the line's reading.
	TagsAsValues
)

// ParseTagMode reads a TagMode by name: "attributes" or "values".
func ParseTagMode(s string) (TagMode, error) {
	switch s {
	case "attributes":
		return TagsAsAttributes, nil
	case "values":
		return TagsAsValues, nil
	}
	return 0, fmt.Errorf("%q: want attributes or values", s)
}

// DefaultNameSeparator joins a line's measurement and field into a
// value name when Options.NameSeparator is zero: climate_temp, as
// VictoriaMetrics and Telegraf's Prometheus output name them.
const DefaultNameSeparator = '_'

// ParseNameSeparator reads a name separator: "_" or ".". With "." a
// name such as climate.temp must be quoted in PromQL
// ({"climate.temp"}); "_" gives climate_temp.
func ParseNameSeparator(s string) (byte, error) {
	switch s {
	case "_", ".":
		return s[0], nil
	}
	return 0, fmt.Errorf(`%q: want "_" or "."`, s)
}

// ParseDeviceTags splits a comma-separated list of tag keys, the tags
// that name a line's device (Options.DeviceTags).
func ParseDeviceTags(s string) ([]string, error) {
	var tags []string
	for t := range strings.SplitSeq(s, ",") {
		t = strings.TrimSpace(t)
		if t == "" {
			return nil, fmt.Errorf("%q: want comma-separated tag keys, none empty", s)
		}
		tags = append(tags, t)
	}
	return tags, nil
}

// Options configure the mapping of a body (ingest/lineproto.Map).
type Options struct {
	// DeviceTags: the first of these tags present on a line names its
	// device.
	DeviceTags []string
	// Tags says what the other tags become; the zero value is
	// TagsAsAttributes.
	Tags TagMode
	// NameSeparator joins the measurement and a field (or, with
	// TagsAsValues, a tag) into a value name: '_' or '.' (see
	// ParseNameSeparator). Zero: DefaultNameSeparator.
	NameSeparator byte
	// Precision is the unit of timestamps (see ParsePrecision). Zero
	// (or less) means nanoseconds, the default of both write APIs.
	Precision time.Duration
	// Now is when the request arrived: the time of lines without a
	// timestamp and the clock of Window.
	Now time.Time
	// Window is the accepted time window, as the ingester applies it.
	Window buckets.Window
	// Allow, when set, says whether the writer may write for a device;
	// the lines of other devices are rejected (CodeDeviceNotAllowed).
	Allow func(device string) bool
	// MaxMessageBytes bounds one published payload; a device's readings
	// are split over several messages beyond it (or beyond
	// buckets.MaxBatch readings). Default DefaultMaxMessageBytes.
	MaxMessageBytes int
}

// Message is one message to publish to JetStream: the readings of one
// device, or the raw text of one rejected line (a dead letter).
type Message struct {
	// Device is the device of the readings or of the rejected line; ""
	// for a rejected line that names no valid device ID.
	Device string
	// DeadLetter marks the raw text of a rejected line; Code and Reason
	// say why it was rejected (Reason names the line, is valid UTF-8
	// without control characters and at most about 1 KiB, so it fits
	// a header).
	DeadLetter bool
	Code       buckets.Code
	Reason     string
	Data       []byte
	// MsgID, for a dead letter, is a hash of its device, data and line,
	// so a retried request gives the same ID: it is published as
	// Nats-Msg-Id (the rejected stream deduplicates them). Readings
	// have none (the readings stream has no duplicate window, and
	// every line protocol reading carries its time, so a retry is
	// merged by the store).
	MsgID string
	// Header holds, for readings, the payload format (wire.Header).
	Header map[string]string
}

// LineError is one rejected line.
type LineError struct {
	Line int // 1-based physical line number in the body
	Err  *buckets.ValidationError
}

// Error reads "line N: <what was wrong>".
func (e LineError) Error() string { return "line " + strconv.Itoa(e.Line) + ": " + e.Err.Error() }

// Result is what the mapper (ingest/lineproto.Map) made of a request body.
type Result struct {
	// Lines counts the entries of the body (blank and comment lines
	// excluded).
	Lines int
	// Readings counts the readings in Messages after merging.
	Readings int
	// Messages carry the accepted readings, grouped per device in the
	// order devices first appear, and the attribute assignments of
	// their lines (in each device's first message).
	Messages []Message
	// Rejected lists the rejected lines in body order; DeadLetters
	// holds one message per rejected line (its raw text).
	Rejected    []LineError
	DeadLetters []Message
}

// ParsePrecision parses the precision query parameter. v1 is the
// /write API (n, ns, u, us, ms, s, m, h); otherwise /api/v2/write (ns,
// us, ms, s). Empty means nanoseconds.
func ParsePrecision(s string, v1 bool) (time.Duration, error) {
	switch s {
	case "", "ns":
		return time.Nanosecond, nil
	case "us":
		return time.Microsecond, nil
	case "ms":
		return time.Millisecond, nil
	case "s":
		return time.Second, nil
	}
	if v1 {
		switch s {
		case "n":
			return time.Nanosecond, nil
		case "u":
			return time.Microsecond, nil
		case "m":
			return time.Minute, nil
		case "h":
			return time.Hour, nil
		}
		return 0, fmt.Errorf("precision %q: want n, ns, u, us, ms, s, m or h", s)
	}
	return 0, fmt.Errorf("precision %q: want ns, us, ms or s", s)
}
