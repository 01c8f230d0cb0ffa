package ingest

import (
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/telemetryd/telemetryd/buckets"
)

// Decode parses the payload of one message published by device and
// returns its readings, each with sorted values, validated by
// buckets.Reading.Validate, and the attribute assignments its reading
// objects carry (nil when none does). It does not check the accepted
// time window (that needs a clock; the Ingester does it).
//
// The payload is JSON, one of
//
//	{"ts": <ts>, "values": {"temp": 21.5, "ok": true}}
//	{"ts": <ts>, "temp": 21.5, "ok": true}
//	[ <either form>, ... ]   (1 to buckets.MaxBatch readings)
//
// where <ts> is an RFC 3339 string or epoch milliseconds (a JSON
// integer). A reading without ts gets defaultTicks. An optional
// "device" string must equal device. JSON integers that fit an int64
// become int values, every other number a float; true and false become
// bools, strings stay strings. null, nested objects and arrays are
// rejected, as are duplicate names.
//
// A reading object may also carry "attributes": {"fleet": "East", ...},
// an object of string values that become attributes of device as of
// the reading's time: one buckets.Assignment per such object, in
// message order. Names and values follow buckets.ValidateAttributeName
// and ValidateAttributeValue; an object holds at most
// buckets.MaxAttributes names, once each, and so do the objects of one
// message together (codes invalid_attribute_name,
// invalid_attribute_value, too_many_attributes). An empty object
// assigns nothing. The reading still needs at least one value.
//
// Every error is a *buckets.ValidationError. Its Index is the position
// of the reading in the message (0 for a payload that is a single
// object) and -1 when the error is about the message as a whole (not
// JSON, not an object or array, an empty or oversized batch, an
// invalid device). Field names the field at fault.
func Decode(device buckets.DeviceID, data []byte, defaultTicks buckets.Ticks) ([]buckets.Reading, []buckets.Assignment, error) {
	if err := device.Validate(); err != nil {
		return nil, nil, err
	}
	d := decoderPool.Get().(*decoder)
	d.reset(device, data, defaultTicks)
	rs, as, verr := d.decode()
	d.release()
	decoderPool.Put(d)
	if verr != nil {
		return nil, nil, verr
	}
	return rs, as, nil
}

// maxInterned bounds the value-name cache of one pooled decoder.
const maxInterned = 1024

var decoderPool = sync.Pool{New: func() any {
	return &decoder{names: make(map[string]string), attrNames: make(map[string]struct{})}
}}

// span marks the fields of one reading inside decoder.fields.
type span struct {
	ticks      buckets.Ticks
	start, end int
}

// attrSpan marks the attributes of one reading object inside
// decoder.attrs.
type attrSpan struct {
	ticks      buckets.Ticks
	start, end int
}

// decoder walks one payload byte by byte. It is reused through
// decoderPool; the slices it returns are always freshly allocated.
type decoder struct {
	buf    []byte
	pos    int
	index  int // reading being decoded; -1 outside a reading
	device buckets.DeviceID
	def    buckets.Ticks

	fields []buckets.Field // values of every reading of the message
	spans  []span
	attrs  []buckets.Attribute // attributes of every reading object of the message
	aspans []attrSpan
	keyBuf []byte            // unescaped key
	strBuf []byte            // unescaped string value
	names  map[string]string // interned value names
	// attrNames are attribute names known valid (interned in names).
	attrNames map[string]struct{}
}

func (d *decoder) reset(device buckets.DeviceID, data []byte, def buckets.Ticks) {
	d.buf, d.pos, d.index = data, 0, -1
	d.device, d.def = device, def
	d.fields, d.spans = d.fields[:0], d.spans[:0]
	d.attrs, d.aspans = d.attrs[:0], d.aspans[:0]
}

func (d *decoder) release() {
	d.buf = nil
	clear(d.fields) // drop references to value strings
	if cap(d.fields) > 64<<10 {
		d.fields = nil
	}
	if cap(d.strBuf) > 64<<10 {
		d.strBuf = nil
	}
	if cap(d.keyBuf) > 64<<10 {
		d.keyBuf = nil
	}
	if cap(d.spans) > 1024 {
		d.spans = nil
	}
	clear(d.attrs)
	if cap(d.attrs) > 1024 {
		d.attrs = nil
	}
	if cap(d.aspans) > 1024 {
		d.aspans = nil
	}
}

// fail builds the error for the reading being decoded.
func (d *decoder) fail(code buckets.Code, field, format string, args ...any) *buckets.ValidationError {
	return buckets.Invalid(code, d.index, field, format, args...)
}

// syntax reports malformed JSON at the current position.
func (d *decoder) syntax(what string) *buckets.ValidationError {
	if d.pos >= len(d.buf) {
		return d.fail(buckets.CodeInvalidPayload, "", "invalid JSON: unexpected end of input, want %s", what)
	}
	return d.fail(buckets.CodeInvalidPayload, "", "invalid JSON at byte %d: unexpected %s, want %s",
		d.pos, quoteChar(d.buf[d.pos]), what)
}

func (d *decoder) decode() ([]buckets.Reading, []buckets.Assignment, *buckets.ValidationError) {
	d.skipWS()
	if d.pos >= len(d.buf) {
		return nil, nil, d.fail(buckets.CodeInvalidPayload, "", "empty payload, want a JSON object or array")
	}
	var err *buckets.ValidationError
	switch d.buf[d.pos] {
	case '{':
		d.index = 0
		err = d.reading()
		d.index = -1
	case '[':
		err = d.batch()
	default:
		return nil, nil, d.syntax("a JSON object or array")
	}
	if err != nil {
		return nil, nil, err
	}
	d.skipWS()
	if d.pos != len(d.buf) {
		return nil, nil, d.syntax("end of input")
	}
	if len(d.aspans) == 0 {
		return d.readings(), nil, nil
	}
	as, err := d.assignments()
	if err != nil {
		return nil, nil, err
	}
	return d.readings(), as, nil
}

// readings builds the result from the spans with two allocations: the
// readings and one array holding every value (each reading's Values has
// its own capacity, so appending to one never clobbers another).
func (d *decoder) readings() []buckets.Reading {
	fs := make([]buckets.Field, len(d.fields))
	copy(fs, d.fields)
	rs := make([]buckets.Reading, len(d.spans))
	for i, s := range d.spans {
		rs[i] = buckets.Reading{Device: d.device, Ticks: s.ticks, Values: fs[s.start:s.end:s.end]}
	}
	return rs
}

// batch decodes a JSON array of readings.
func (d *decoder) batch() *buckets.ValidationError {
	d.pos++ // '['
	d.skipWS()
	if d.pos < len(d.buf) && d.buf[d.pos] == ']' {
		d.pos++
		return d.fail(buckets.CodeEmptyBatch, "", "a batch needs at least one reading")
	}
	for i := 0; ; i++ {
		if i == buckets.MaxBatch {
			d.index = -1
			return d.fail(buckets.CodeBatchTooLarge, "", "a batch holds at most %d readings", buckets.MaxBatch)
		}
		d.index = i
		d.skipWS()
		if d.pos >= len(d.buf) || d.buf[d.pos] != '{' {
			return d.syntax("a reading object")
		}
		if err := d.reading(); err != nil {
			return err
		}
		d.skipWS()
		if d.pos >= len(d.buf) {
			return d.syntax("',' or ']'")
		}
		switch d.buf[d.pos] {
		case ',':
			d.pos++
		case ']':
			d.pos++
			d.index = -1
			return nil
		default:
			return d.syntax("',' or ']'")
		}
	}
}

// readingKeys remembers which reserved keys one reading object used.
type readingKeys struct {
	ts, device, values, flat, attributes bool
}

// reading decodes one reading object starting at '{', then sorts and
// validates its values.
func (d *decoder) reading() *buckets.ValidationError {
	d.pos++ // '{'
	s := span{ticks: d.def, start: len(d.fields)}
	var seen readingKeys
	err := d.members(func(key []byte) *buckets.ValidationError {
		return d.readingMember(key, &s, &seen)
	})
	if err != nil {
		return err
	}
	if seen.attributes {
		if err := d.endAttributes(s.ticks); err != nil {
			return err
		}
	}
	s.end = len(d.fields)
	vals := d.fields[s.start:s.end]
	if dup, ok := buckets.SortValues(vals); !ok {
		return d.fail(buckets.CodeDuplicateValue, "values."+shortName(dup), "value name appears more than once")
	}
	r := buckets.Reading{Device: d.device, Ticks: s.ticks, Values: vals}
	if err := r.Validate(); err != nil {
		ve := err.(*buckets.ValidationError)
		ve.Index = d.index
		return ve
	}
	d.spans = append(d.spans, s)
	return nil
}

// readingMember decodes the value of one key of a reading object.
func (d *decoder) readingMember(key []byte, s *span, seen *readingKeys) *buckets.ValidationError {
	switch string(key) {
	case "ts":
		if seen.ts {
			return d.fail(buckets.CodeInvalidPayload, "ts", "key appears more than once")
		}
		seen.ts = true
		k, err := d.timestamp()
		s.ticks = k
		return err
	case "device":
		if seen.device {
			return d.fail(buckets.CodeInvalidPayload, "device", "key appears more than once")
		}
		seen.device = true
		return d.deviceField()
	case "values":
		if seen.values {
			return d.fail(buckets.CodeInvalidPayload, "values", "key appears more than once")
		}
		if seen.flat {
			return d.mixed("values")
		}
		seen.values = true
		if d.pos >= len(d.buf) || d.buf[d.pos] != '{' {
			return d.fail(buckets.CodeInvalidPayload, "values", "must be an object of named values")
		}
		d.pos++
		return d.members(func(name []byte) *buckets.ValidationError { return d.value(name) })
	case "attributes":
		if seen.attributes {
			return d.fail(buckets.CodeInvalidPayload, "attributes", "key appears more than once")
		}
		seen.attributes = true
		return d.attributes()
	default:
		if seen.values {
			return d.mixed("values." + shortName(string(key)))
		}
		seen.flat = true
		return d.value(key)
	}
}

func (d *decoder) mixed(field string) *buckets.ValidationError {
	return d.fail(buckets.CodeInvalidPayload, field,
		"a reading has either a \"values\" object or flat values, not both")
}

// members walks the members of an object whose '{' was consumed,
// calling member with each key once the ':' is consumed; member must
// consume the value. The key is only valid during the call.
func (d *decoder) members(member func(key []byte) *buckets.ValidationError) *buckets.ValidationError {
	d.skipWS()
	if d.pos < len(d.buf) && d.buf[d.pos] == '}' {
		d.pos++
		return nil
	}
	for {
		d.skipWS()
		if d.pos >= len(d.buf) || d.buf[d.pos] != '"' {
			return d.syntax("a quoted key")
		}
		key, err := d.key()
		if err != nil {
			return err
		}
		d.skipWS()
		if d.pos >= len(d.buf) || d.buf[d.pos] != ':' {
			return d.syntax("':'")
		}
		d.pos++
		d.skipWS()
		if err := member(key); err != nil {
			return err
		}
		d.skipWS()
		if d.pos >= len(d.buf) {
			return d.syntax("',' or '}'")
		}
		switch d.buf[d.pos] {
		case ',':
			d.pos++
		case '}':
			d.pos++
			return nil
		default:
			return d.syntax("',' or '}'")
		}
	}
}

// timestamp decodes the value of "ts".
func (d *decoder) timestamp() (buckets.Ticks, *buckets.ValidationError) {
	if d.pos >= len(d.buf) {
		return 0, d.syntax("a value")
	}
	switch c := d.buf[d.pos]; {
	case c == '"':
		b, err := d.str()
		if err != nil {
			return 0, err
		}
		k, perr := buckets.ParseTime(string(b))
		if perr != nil {
			return 0, d.fail(buckets.CodeInvalidTime, "ts", "%s", perr.Error())
		}
		return k, nil
	case c == '-' || isDigit(c):
		lit, isInt, err := d.number()
		if err != nil {
			return 0, err
		}
		if !isInt {
			return 0, d.fail(buckets.CodeInvalidTime, "ts",
				"epoch milliseconds must be a whole number, got %s", truncate(lit, 40))
		}
		ms, ok := parseInt64(lit)
		if !ok {
			return 0, d.fail(buckets.CodeInvalidTime, "ts",
				"epoch milliseconds %s is out of range", truncate(lit, 40))
		}
		k, terr := buckets.TicksFromEpochMillis(ms)
		if terr != nil {
			return 0, d.fail(buckets.CodeInvalidTime, "ts", "%s", terr.Error())
		}
		return k, nil
	case c == '{' || c == '[' || c == 'n' || c == 't' || c == 'f':
		return 0, d.fail(buckets.CodeInvalidTime, "ts", "want an RFC 3339 string or epoch milliseconds")
	default:
		return 0, d.syntax("a value")
	}
}

// deviceField checks the optional "device" member against the subject.
func (d *decoder) deviceField() *buckets.ValidationError {
	if d.pos >= len(d.buf) || !isValueStart(d.buf[d.pos]) {
		return d.syntax("a value")
	}
	if d.buf[d.pos] != '"' {
		return d.fail(buckets.CodeDeviceMismatch, "device", "must be a string equal to the subject's device %q", string(d.device))
	}
	b, err := d.str()
	if err != nil {
		return err
	}
	if string(b) != string(d.device) {
		return d.fail(buckets.CodeDeviceMismatch, "device", "%s differs from the subject's device %q",
			strconv.Quote(truncate(b, 80)), string(d.device))
	}
	return nil
}

// value decodes one named value and appends it to d.fields.
func (d *decoder) value(key []byte) *buckets.ValidationError {
	if d.pos >= len(d.buf) {
		return d.syntax("a value")
	}
	var v buckets.Value
	switch c := d.buf[d.pos]; {
	case c == '"':
		b, err := d.str()
		if err != nil {
			return err
		}
		if !utf8.Valid(b) {
			return d.fail(buckets.CodeInvalidValue, "values."+shortName(string(key)), "string is not valid UTF-8")
		}
		v = buckets.String(string(b))
	case c == 't' || c == 'f':
		b, err := d.boolean()
		if err != nil {
			return err
		}
		v = buckets.Bool(b)
	case c == '-' || isDigit(c):
		n, err := d.numberValue(key)
		if err != nil {
			return err
		}
		v = n
	case c == 'n':
		return d.fail(buckets.CodeInvalidValue, "values."+shortName(string(key)), "null is not a value")
	case c == '{':
		return d.fail(buckets.CodeInvalidValue, "values."+shortName(string(key)), "nested objects are not accepted")
	case c == '[':
		return d.fail(buckets.CodeInvalidValue, "values."+shortName(string(key)), "arrays are not accepted")
	default:
		return d.syntax("a value")
	}
	d.fields = append(d.fields, buckets.Field{Name: d.intern(key), Value: v})
	return nil
}

// numberValue decodes a number: an int64 when the literal is an integer
// that fits, otherwise a finite float64.
func (d *decoder) numberValue(key []byte) (buckets.Value, *buckets.ValidationError) {
	lit, isInt, err := d.number()
	if err != nil {
		return buckets.Value{}, err
	}
	if isInt {
		if i, ok := parseInt64(lit); ok {
			return buckets.Int(i), nil
		}
	}
	f, perr := strconv.ParseFloat(string(lit), 64)
	if perr != nil {
		return buckets.Value{}, d.fail(buckets.CodeInvalidValue, "values."+shortName(string(key)),
			"%s is outside the float64 range", truncate(lit, 40))
	}
	return buckets.Float(f), nil
}

// intern returns key as a string, sharing one copy per distinct name.
func (d *decoder) intern(key []byte) string {
	if s, ok := d.names[string(key)]; ok {
		return s
	}
	s := string(key)
	if len(s) <= buckets.MaxValueNameLen {
		if len(d.names) >= maxInterned {
			clear(d.names)
		}
		d.names[s] = s
	}
	return s
}

// shortName keeps error fields readable when a name is absurdly long.
func shortName(name string) string {
	if len(name) > buckets.MaxValueNameLen {
		return name[:16] + "..."
	}
	return name
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

func quoteChar(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return strconv.QuoteRune(rune(c))
	}
	return "byte 0x" + strconv.FormatUint(uint64(c), 16)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// isValueStart reports whether c can start a JSON value.
func isValueStart(c byte) bool {
	switch c {
	case '"', '{', '[', 't', 'f', 'n', '-':
		return true
	}
	return isDigit(c)
}

// checkWindow rejects the message when any of its readings lies outside
// the accepted time window at now. The error names the reading index.
func checkWindow(rs []buckets.Reading, w buckets.Window, now time.Time) error {
	for i := range rs {
		if err := w.Check(rs[i].Ticks, now); err != nil {
			ve := err.(*buckets.ValidationError)
			ve.Index = i
			return ve
		}
	}
	return nil
}

// checkAssignWindow rejects the message when an assignment holds as of
// a time outside the accepted window at now: a far-future one would
// outrank every later assignment.
func checkAssignWindow(as []buckets.Assignment, w buckets.Window, now time.Time) error {
	for i := range as {
		if err := w.Check(as[i].At, now); err != nil {
			ve := err.(*buckets.ValidationError)
			ve.Field = "attributes"
			return ve
		}
	}
	return nil
}
