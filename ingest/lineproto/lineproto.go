// Package lineproto maps InfluxDB line protocol onto telemetry
// messages (DESIGN §9). It parses with
// github.com/influxdata/line-protocol/v2 and produces, for one write
// request, the JSON messages to publish on <prefix>.<device> (one group
// per device) and a dead letter for every line it rejects. It does no
// I/O: the HTTP handler publishes what Map returns.
//
// Mapping of one line `<measurement>,<tags> <fields> [<timestamp>]`:
//
//   - device: the value of the first tag present among
//     Options.DeviceTags; none present is invalid_device;
//   - each field becomes the value <measurement>.<field>: float as
//     float, integer (i) as int, unsigned (u) as int when it fits an
//     int64 (else invalid_value), bool as bool, string as string;
//   - each other tag becomes the string value <measurement>.<tag>;
//   - the timestamp, in the request's precision, truncated to 100 ns
//     ticks; a line without one takes Options.Now.
//
// Lines of one request with the same device and time merge into one
// reading. Two lines giving one value name different values at the
// same device and time conflict: the later line is rejected
// (conflicting_lines). Every line is validated as the ingester would
// (names, values, time window) before anything is published, so one
// bad line never holds back the good ones.
package lineproto

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	lp "github.com/influxdata/line-protocol/v2/lineprotocol"

	"github.com/telemetryd/telemetryd/buckets"
)

// CodeConflictingLines rejects a line that gives a value name another
// value than an earlier line of its request at the same device and
// time.
const CodeConflictingLines buckets.Code = "conflicting_lines"

// CodeDeviceNotAllowed rejects a line whose device the writer may not
// write (Options.Allow). Such a line gets no dead letter: it is a
// refused request, not bad device data.
const CodeDeviceNotAllowed buckets.Code = "device_not_allowed"

// Headers of dead letters; the same names the ingester uses.
const (
	HeaderErrorCode = "Telemetry-Error-Code"
	HeaderError     = "Telemetry-Error"
)

// DefaultMaxMessageBytes bounds the payload of one published message
// when Options.MaxMessageBytes is zero (NATS's default max payload).
const DefaultMaxMessageBytes = 1 << 20

// invalidDeviceToken is the device token of the dead letter subject of
// a line whose device is unknown or unusable.
const invalidDeviceToken = "_invalid"

// Options configure Map.
type Options struct {
	// SubjectPrefix: readings go to <prefix>.<device>, dead letters to
	// rejected.<prefix>.<device>.
	SubjectPrefix string
	// DeviceTags: the first of these tags present on a line names its
	// device.
	DeviceTags []string
	// Precision is the unit of timestamps (see ParsePrecision).
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

// Message is one message to publish to JetStream.
type Message struct {
	Subject string
	Data    []byte
	// MsgID is the Nats-Msg-Id: a hash of subject and data, so a
	// retried request is deduplicated by the stream.
	MsgID string
	// Header holds the dead-letter headers; nil for readings.
	Header map[string]string
}

// LineError is one rejected line.
type LineError struct {
	Line int // 1-based physical line number in the body
	Err  *buckets.ValidationError
}

// Error reads "line N: <what was wrong>".
func (e LineError) Error() string { return "line " + strconv.Itoa(e.Line) + ": " + e.Err.Error() }

// Result is what Map made of a request body.
type Result struct {
	// Lines counts the entries of the body (blank and comment lines
	// excluded).
	Lines int
	// Readings counts the readings in Messages after merging.
	Readings int
	// Messages carry the accepted readings, grouped per device in the
	// order devices first appear.
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

// readingKey is the identity of a reading.
type readingKey struct {
	device buckets.DeviceID
	ticks  buckets.Ticks
}

// slot is one value of a merged reading and the line that gave it.
type slot struct {
	value buckets.Value
	line  int
}

// mapper holds the state of one Map call.
type mapper struct {
	opts     Options
	res      Result
	readings map[readingKey]map[string]slot
	order    map[buckets.DeviceID][]buckets.Ticks // per device, first-seen order of its readings
	devices  []buckets.DeviceID                   // first-seen order
	fields   []buckets.Field                      // scratch: values of the current line
	cur      int                                  // physical number of the line being mapped
}

// Map parses body and maps every line (see the package comment).
func Map(body []byte, opts Options) Result {
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = DefaultMaxMessageBytes
	}
	m := &mapper{
		opts:     opts,
		readings: make(map[readingKey]map[string]slot),
		order:    make(map[buckets.DeviceID][]buckets.Ticks),
	}
	for line := range splitLines(body) {
		m.res.Lines++
		m.cur = line.number
		if dev, ve := m.line(line.text); ve != nil {
			m.reject(line, dev, ve)
		}
	}
	m.build()
	return m.res
}

// reject records a bad line and its dead letter.
func (m *mapper) reject(l rawLine, dev string, ve *buckets.ValidationError) {
	le := LineError{Line: l.number, Err: ve}
	m.res.Rejected = append(m.res.Rejected, le)
	if ve.Code == CodeDeviceNotAllowed {
		return
	}
	if buckets.DeviceID(dev).Validate() != nil {
		dev = invalidDeviceToken
	}
	subject := "rejected." + m.opts.SubjectPrefix + "." + dev
	data := bytes.Clone(l.text)
	m.res.DeadLetters = append(m.res.DeadLetters, Message{
		Subject: subject,
		Data:    data,
		MsgID:   msgID(subject, data, strconv.Itoa(l.number)),
		Header: map[string]string{
			HeaderErrorCode: string(ve.Code),
			HeaderError:     headerValue(le.Error()),
		},
	})
}

// line validates one entry and merges it into the request's readings.
// dev is the device, as far as it was found (for the dead letter).
func (m *mapper) line(text []byte) (dev string, _ *buckets.ValidationError) {
	dec := lp.NewDecoderWithBytes(text)
	if !dec.Next() {
		return "", syntax(errors.New("empty line"))
	}
	meas, err := dec.Measurement()
	if err != nil {
		return "", syntax(err)
	}
	measurement := string(meas)
	m.fields = m.fields[:0]
	var tags []buckets.Field
	devTag := len(m.opts.DeviceTags)
	for {
		k, v, err := dec.NextTag()
		if err != nil {
			return dev, syntax(err)
		}
		if k == nil {
			break
		}
		if i := indexOf(m.opts.DeviceTags, k); i >= 0 && i < devTag {
			if devTag < len(m.opts.DeviceTags) {
				// A device tag of lower rank becomes a value.
				tags = append(tags, buckets.Field{Name: m.opts.DeviceTags[devTag], Value: buckets.String(dev)})
			}
			devTag, dev = i, string(v)
			continue
		}
		tags = append(tags, buckets.Field{Name: string(k), Value: buckets.String(string(v))})
	}
	for {
		k, v, err := dec.NextField()
		if err != nil {
			if errors.Is(err, lp.ErrValueOutOfRange) {
				return dev, invalid(buckets.CodeInvalidValue, "", "%s", decodeMsg(err))
			}
			return dev, syntax(err)
		}
		if k == nil {
			break
		}
		val, ve := fieldValue(v)
		if ve != nil {
			ve.Field = "field " + string(k)
			return dev, ve
		}
		m.fields = append(m.fields, buckets.Field{Name: measurement + "." + string(k), Value: val})
	}
	tb, err := dec.TimeBytes()
	if err != nil {
		return dev, syntax(err)
	}
	if devTag == len(m.opts.DeviceTags) {
		return "", invalid(buckets.CodeInvalidDevice, "tags", "no device tag: want one of %v", m.opts.DeviceTags)
	}
	if err := buckets.DeviceID(dev).Validate(); err != nil {
		ve := err.(*buckets.ValidationError)
		ve.Field = "tag " + m.opts.DeviceTags[devTag]
		return dev, ve
	}
	if m.opts.Allow != nil && !m.opts.Allow(dev) {
		return dev, invalid(CodeDeviceNotAllowed, "tag "+m.opts.DeviceTags[devTag], "the token may not write for device %q", dev)
	}
	for _, t := range tags {
		m.fields = append(m.fields, buckets.Field{Name: measurement + "." + t.Name, Value: t.Value})
	}
	ticks, ve := m.ticks(tb)
	if ve != nil {
		return dev, ve
	}
	r := buckets.Reading{Device: buckets.DeviceID(dev), Ticks: ticks, Values: m.fields}
	if name, ok := buckets.SortValues(r.Values); !ok {
		return dev, invalid(buckets.CodeDuplicateValue, name, "the line gives this value name twice (a tag and a field, or a field twice)")
	}
	if err := r.Validate(); err != nil {
		return dev, err.(*buckets.ValidationError)
	}
	if err := m.opts.Window.Check(ticks, m.opts.Now); err != nil {
		var ve *buckets.ValidationError
		if errors.As(err, &ve) {
			return dev, ve
		}
		return dev, invalid(buckets.CodeInvalidTime, "timestamp", "%s", err.Error())
	}
	return dev, m.merge(r, m.cur)
}

// ticks converts the line's timestamp (or Now) to ticks.
func (m *mapper) ticks(tb []byte) (buckets.Ticks, *buckets.ValidationError) {
	t := m.opts.Now
	if tb != nil {
		n, err := strconv.ParseInt(string(tb), 10, 64)
		if err != nil {
			return 0, invalid(buckets.CodeInvalidTime, "timestamp", "%q is not an integer in range", tb)
		}
		p := int64(m.opts.Precision)
		if n > math.MaxInt64/p || n < math.MinInt64/p {
			return 0, invalid(buckets.CodeInvalidTime, "timestamp", "%d at precision %s is out of range", n, m.opts.Precision)
		}
		t = time.Unix(0, n*p)
	}
	k, err := buckets.TicksOf(t)
	if err != nil {
		return 0, invalid(buckets.CodeInvalidTime, "timestamp", "%s", err.Error())
	}
	return k, nil
}

// merge adds r's values to the request's reading of the same device
// and time, unless one of them conflicts with an earlier line.
func (m *mapper) merge(r buckets.Reading, line int) *buckets.ValidationError {
	key := readingKey{r.Device, r.Ticks}
	cur, ok := m.readings[key]
	if !ok {
		cur = make(map[string]slot, len(r.Values))
		m.readings[key] = cur
		if _, seen := m.order[r.Device]; !seen {
			m.devices = append(m.devices, r.Device)
		}
		m.order[r.Device] = append(m.order[r.Device], r.Ticks)
	}
	added := 0
	for _, f := range r.Values {
		s, ok := cur[f.Name]
		if !ok {
			added++
			continue
		}
		if s.value != f.Value {
			return invalid(CodeConflictingLines, f.Name, "line %d gives %v at the same device and time; this line gives %v",
				s.line, s.value.Any(), f.Value.Any())
		}
	}
	if len(cur)+added > buckets.MaxValues {
		return invalid(buckets.CodeTooManyValues, "", "merged with earlier lines of the same device and time this reading has %d values, more than %d",
			len(cur)+added, buckets.MaxValues)
	}
	for _, f := range r.Values {
		if _, ok := cur[f.Name]; !ok {
			cur[f.Name] = slot{value: f.Value, line: line}
		}
	}
	return nil
}

// fieldValue converts a line protocol field value.
func fieldValue(v lp.Value) (buckets.Value, *buckets.ValidationError) {
	switch v.Kind() {
	case lp.Float:
		return buckets.Float(v.FloatV()), nil
	case lp.Int:
		return buckets.Int(v.IntV()), nil
	case lp.Uint:
		u := v.UintV()
		if u > math.MaxInt64 {
			return buckets.Value{}, invalid(buckets.CodeInvalidValue, "", "unsigned %du is larger than the largest stored integer %d", u, int64(math.MaxInt64))
		}
		return buckets.Int(int64(u)), nil
	case lp.Bool:
		return buckets.Bool(v.BoolV()), nil
	case lp.String:
		s := v.StringV()
		if len(s) > buckets.MaxStringLen {
			return buckets.Value{}, invalid(buckets.CodeStringTooLong, "", "string of %d bytes is longer than %d", len(s), buckets.MaxStringLen)
		}
		return buckets.String(s), nil
	}
	return buckets.Value{}, invalid(buckets.CodeInvalidValue, "", "unknown field type %v", v.Kind())
}

func indexOf(tags []string, k []byte) int {
	for i, t := range tags {
		if t == string(k) {
			return i
		}
	}
	return -1
}

func invalid(code buckets.Code, field, format string, args ...any) *buckets.ValidationError {
	return buckets.Invalid(code, -1, field, format, args...)
}

// syntax reports a line the parser refused.
func syntax(err error) *buckets.ValidationError {
	return invalid(buckets.CodeInvalidPayload, "", "line protocol: %s", decodeMsg(err))
}

// decodeMsg is the parser's message with its column, without its line
// number (the parser only ever sees one line).
func decodeMsg(err error) string {
	var de *lp.DecodeError
	if errors.As(err, &de) {
		return "column " + strconv.Itoa(de.Column) + ": " + de.Err.Error()
	}
	return err.Error()
}
