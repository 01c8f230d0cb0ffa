// Package lineproto maps InfluxDB line protocol onto telemetry
// messages (ingest/README.md). It parses with
// github.com/influxdata/line-protocol/v2 and produces, for one write
// request, the messages of each device's readings (one group per
// device, in the binary form of package buckets/wire) and a dead letter
// for every line it rejects. It does no I/O and knows no NATS subject:
// the HTTP handler hands what Map returns to a publisher, which puts a
// device's messages on its subject and the dead letters on the
// rejected ones, with the reason in headers (package ingest/topology
// names them). What it is given and returns is data of package
// buckets/linemsg, which the HTTP door and the publisher share; the
// door reaches the mapper through an interface it declares
// (api.LineMapper), which Mapper implements.
//
// Mapping of one line `<measurement>,<tags> <fields> [<timestamp>]`:
//
//   - device: the value of the first tag present among
//     linemsg.Options.DeviceTags; none present is invalid_device;
//   - each field becomes the value <measurement><sep><field>, sep
//     being linemsg.Options.NameSeparator (_ by default, so climate,... temp=1
//     is climate_temp, a name PromQL writes plainly): float as
//     float, integer (i) as int, unsigned (u) as int when it fits an
//     int64 (else invalid_value), bool as bool, string as string;
//   - each other tag (a lower-ranked device tag too) becomes an
//     attribute of the device as of the line's time (linemsg.TagsAsAttributes,
//     the default): its key must be a valid attribute name and its
//     value a valid attribute value (buckets.ValidateAttributeName,
//     ValidateAttributeValue), at most buckets.MaxAttributes a line;
//     with linemsg.TagsAsValues it becomes the string value
//     <measurement><sep><tag> instead;
//   - the timestamp, in the request's precision, truncated to 100 ns
//     ticks; a line without one takes linemsg.Options.Now.
//
// Lines of one request with the same device and time merge into one
// reading. Two lines giving one value name, or one attribute, different
// values at the same device and time conflict: the later line is
// rejected (conflicting_lines). The lines of one device may name at
// most buckets.MaxAttributes attributes together. Every line is
// validated as the ingester would (names, values, attributes, time
// window) before anything is published, so one bad line never holds
// back the good ones.
//
// A device's attributes travel in its first message as assignments:
// per attribute the value of its latest line (the store keeps the
// newest by time anyway), grouped by that line's time.
package lineproto

import (
	"bytes"
	"cmp"
	"errors"
	"math"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	lp "github.com/influxdata/line-protocol/v2/lineprotocol"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
)

// CodeConflictingLines rejects a line that gives a value name another
// value than an earlier line of its request at the same device and
// time.
const CodeConflictingLines buckets.Code = "conflicting_lines"

// readingKey is the identity of a reading: its device (an index into
// mapper.devs) and time.
type readingKey struct {
	device int32
	ticks  buckets.Ticks
}

// pending is one merged reading: its values sorted by name, and for
// each the line that gave it; its attributes sorted by name, each with
// the line that gave it.
type pending struct {
	ticks  buckets.Ticks
	fields []buckets.Field
	line   int32   // the line that gave every value, until a merge
	lines  []int32 // per value, once another line merged in
	attrs  []lineAttr
}

// lineAttr is an attribute and the line that gave it.
type lineAttr struct {
	buckets.Attribute
	line int32
}

// lineOf is the line that gave value i.
func (p *pending) lineOf(i int) int32 {
	if p.lines == nil {
		return p.line
	}
	return p.lines[i]
}

// deviceReadings are the readings of one device, in first-seen order.
type deviceReadings struct {
	id       buckets.DeviceID
	readings []int32       // indexes into mapper.pending
	last     buckets.Ticks // the latest time among readings
	unsorted bool          // some reading came after a later one
	// indexed: every reading of the device is in mapper.index. A line
	// later than last cannot merge into an earlier reading, so the
	// index is only built, per device, once a line is not.
	indexed bool
	// attrNames are the attribute names the device's lines gave,
	// sorted; at most buckets.MaxAttributes.
	attrNames []string
	// spare is how many values the device's latest merge added to a
	// reading: its next new reading is given room for as many, so that
	// the usual second line of a time (TSBS's diagnostics after its
	// readings) merges in place instead of into a copy.
	spare int
}

// devInfo is a device named by a line of the request, checked once.
type devInfo struct {
	id      buckets.DeviceID
	invalid *buckets.ValidationError // why id is not a device ID; nil when it is
	allowed bool                     // linemsg.Options.Allow said yes
	group   int32                    // index in mapper.devices once a reading merged, else -1
}

// nameSlot caches the value name of the key at one position of the
// previous line (lines of a batch mostly repeat their keys in order).
type nameSlot struct {
	key  []byte
	name string
}

// mapper holds the state of one Map call.
type mapper struct {
	opts     linemsg.Options
	res      linemsg.Result
	index    map[readingKey]int32 // reading -> pending index
	pending  []pending
	devices  []deviceReadings
	devs     []devInfo
	devByID  map[string]int32  // device -> devs index
	devBuf   []byte            // scratch: the device tag's value of the current line
	lastDev  int32             // devs index of the previous line's device, or -1
	slots    []nameSlot        // names of the previous line's keys, by position
	slotMeas []byte            // the measurement slots belong to
	lo, hi   buckets.Ticks     // the accepted window in ticks, when known
	window   bool              // lo and hi are set
	names    map[string]string // interned "<measurement><sep><key>" names
	sep      byte              // linemsg.Options.NameSeparator or its default
	badName  map[string]*buckets.ValidationError
	values   arena[buckets.Field] // backs the values of readings
	lineNos  arena[int32]         // backs pending.lines
	enc      wire.Encoder
	outHint  int               // initial capacity of the buffer of the payloads
	fields   []buckets.Field   // scratch: values of the current line
	tags     []tagKV           // scratch: other tags of the current line
	tagBuf   []byte            // scratch: the keys of tags
	tagVals  map[string]string // interned tag values
	attrs    []lineAttr        // scratch: the tags of the current line as attributes, sorted
	attrTmp  []lineAttr        // scratch of sortAttrs
	// attrPerm orders the attributes of a line whose tags are
	// attrPermNames, in that order, by name.
	attrPerm      []int
	attrPermNames []string
	attrArena     []lineAttr                          // backs the attributes of new readings
	attrOK        map[string]string                   // interned valid attribute names
	badAttr       map[string]*buckets.ValidationError // invalid attribute names
	nameBuf       []byte                              // scratch: a value name being built
	cur           int                                 // physical number of the line being mapped
	// perm orders the values of a line by name; it holds for the next
	// line while permOK and the line's names are the slots unchanged.
	perm     []int
	permOK   bool
	sorted   []buckets.Field          // scratch: the values of the current line in name order
	nowTicks buckets.Ticks            // linemsg.Options.Now in ticks
	nowErr   *buckets.ValidationError // why linemsg.Options.Now has no ticks
}

// tagKV is a tag other than the device tag. Its key is in
// mapper.tagBuf (at start:end while the line's tags are read).
type tagKV struct {
	key        []byte
	value      string
	start, end int
}

// withDefaults fills the zero fields that have a default.
func withDefaults(o linemsg.Options) linemsg.Options {
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = linemsg.DefaultMaxMessageBytes
	}
	if o.Precision <= 0 {
		o.Precision = time.Nanosecond
	}
	return o
}

// Mapper offers Map and MapAll as methods, for a caller that declares
// them as an interface.
type Mapper struct{}

// Map is Map.
func (Mapper) Map(body []byte, opts linemsg.Options) linemsg.Result { return Map(body, opts) }

// MapAll is MapAll.
func (Mapper) MapAll(body []byte, opts linemsg.Options) (linemsg.Result, bool) {
	return MapAll(body, opts)
}

// Map parses body and maps every line (see the package comment).
func Map(body []byte, opts linemsg.Options) linemsg.Result {
	opts = withDefaults(opts)
	if res, ok := MapAll(body, opts); ok {
		return res
	}
	// Some line is bad: map line by line, each with its own decoder, so
	// every error is pinned to its physical line and its raw text.
	var entries []rawLine
	for line := range splitLines(body) {
		entries = append(entries, line)
	}
	return mapEach(opts, entries).finish(len(entries))
}

// MapAll maps body as Map does when every line of it is good. As soon
// as a line is not, it stops and reports false, holding nothing: the
// caller then maps the body with Map, which names every bad line, in
// parts if it wants to bound the memory that takes (a rejected line
// costs many times its text). What MapAll holds grows with the size of
// the body alone, and all of it is one request's: a device's lines
// merge into few large messages, not a message per part.
func MapAll(body []byte, opts linemsg.Options) (linemsg.Result, bool) {
	opts = withDefaults(opts)
	m := newMapper(opts, bytes.Count(body, []byte{'\n'})+1, len(body))
	if n, ok := m.fast(body); ok {
		return m.finish(n), true
	}
	m.release()
	return linemsg.Result{}, false
}

// mapEach maps every entry with a decoder of its own.
func mapEach(opts linemsg.Options, entries []rawLine) *mapper {
	size := 0
	for _, e := range entries {
		size += len(e.text) + 1
	}
	m := newMapper(opts, len(entries), size)
	for _, line := range entries {
		m.cur = line.number
		if dev, ve := m.line(line.text); ve != nil {
			m.reject(line, dev, ve)
		}
	}
	return m
}

// finish encodes the messages, returns the result and releases m.
func (m *mapper) finish(lines int) linemsg.Result {
	m.res.Lines = lines
	m.build()
	res := m.res
	m.release()
	return res
}

// idleMappers keeps the mappers of finished Map calls (their arenas,
// indexes and maps) for the next request, so that a stream of write
// requests allocates little more than the messages it returns. It keeps
// at most GOMAXPROCS: mapping is CPU work, so no more are mapping at
// full speed at once, and what it keeps is live at every collection
// (and stays while no request comes; a mapper of more than
// maxPooledLines lines is never kept). (A
// sync.Pool kept three to four for two requests in flight, one per
// processor besides those kept over from the collection before: about
// 13 MB for requests of 10,000 TSBS lines.) A request that finds none
// makes its own, and when the list is full leaves it to the GC.
var idleMappers struct {
	sync.Mutex
	ms []*mapper
}

// getMapper returns an idle mapper, or a new one.
func getMapper() *mapper {
	idleMappers.Lock()
	if n := len(idleMappers.ms); n > 0 {
		m := idleMappers.ms[n-1]
		idleMappers.ms[n-1] = nil
		idleMappers.ms = idleMappers.ms[:n-1]
		idleMappers.Unlock()
		return m
	}
	idleMappers.Unlock()
	return &mapper{
		devByID: make(map[string]int32),
		names:   make(map[string]string),
		badName: make(map[string]*buckets.ValidationError),
		attrOK:  make(map[string]string),
		badAttr: make(map[string]*buckets.ValidationError),
		tagVals: make(map[string]string),
	}
}

// maxIdleMappers is how many mappers idleMappers keeps.
func maxIdleMappers() int { return runtime.GOMAXPROCS(0) }

// idleFull reports whether idleMappers has no room for another.
func idleFull() bool {
	idleMappers.Lock()
	defer idleMappers.Unlock()
	return len(idleMappers.ms) >= maxIdleMappers()
}

// putMapper keeps m, a reset mapper, when idleMappers has room.
func putMapper(m *mapper) {
	idleMappers.Lock()
	defer idleMappers.Unlock()
	if len(idleMappers.ms) < maxIdleMappers() {
		idleMappers.ms = append(idleMappers.ms, m)
	}
}

// maxPooledLines bounds the request size whose mapper is kept for
// reuse: the buffers of a rare huge request are left to the GC.
const maxPooledLines = 1 << 16

// newMapper returns a reset mapper for a body of about lines lines and
// size bytes.
func newMapper(opts linemsg.Options, lines, size int) *mapper {
	m := getMapper()
	m.opts = opts
	m.sep = cmp.Or(opts.NameSeparator, linemsg.DefaultNameSeparator)
	m.lastDev = -1
	// A reading of a few values is about 30 bytes in the binary form;
	// readings of many values take about 40% of their text (TSBS IoT).
	m.outHint = 4096 + max(40*lines, size/2)
	m.pending = slices.Grow(m.pending, lines)
	// The window in ticks, checked as Window.Check does: older than
	// now - Retention (at tick resolution) or newer than now +
	// MaxFutureSkew is outside.
	lo, err1 := buckets.TicksOf(opts.Now.Add(-opts.Window.Retention).Truncate(100 * time.Nanosecond))
	hi, err2 := buckets.TicksOf(opts.Now.Add(opts.Window.MaxFutureSkew).Truncate(100 * time.Nanosecond))
	m.lo, m.hi, m.window = lo, hi, err1 == nil && err2 == nil
	if k, err := buckets.TicksOf(opts.Now); err != nil {
		m.nowTicks, m.nowErr = 0, invalid(buckets.CodeInvalidTime, "timestamp", "%s", err.Error())
	} else {
		m.nowTicks, m.nowErr = k, nil
	}
	return m
}

// release resets m, keeping its buffers, and puts it back in
// idleMappers, when there is room. Nothing m.res returned refers to
// them.
func (m *mapper) release() {
	if cap(m.pending) > maxPooledLines || idleFull() {
		return
	}
	m.opts, m.res = linemsg.Options{}, linemsg.Result{}
	clear(m.index)
	clear(m.pending)
	m.pending = m.pending[:0]
	for i := range m.devices {
		m.devices[i] = deviceReadings{readings: m.devices[i].readings[:0], attrNames: m.devices[i].attrNames[:0]}
	}
	m.devices = m.devices[:0]
	clear(m.devs)
	m.devs = m.devs[:0]
	clear(m.devByID)
	clear(m.names)
	clear(m.badName)
	clear(m.attrOK)
	clear(m.badAttr)
	clear(m.tagVals)
	clear(m.attrs)
	clear(m.attrTmp)
	clear(m.attrPermNames)
	m.attrTmp, m.attrPermNames, m.attrPerm = m.attrTmp[:0], m.attrPermNames[:0], m.attrPerm[:0]
	clear(m.attrArena)
	m.attrs, m.attrArena = m.attrs[:0], m.attrArena[:0]
	m.slots, m.slotMeas, m.permOK = m.slots[:0], m.slotMeas[:0], false
	m.values.reset()
	m.lineNos.reset()
	clear(m.fields)
	clear(m.sorted)
	clear(m.tags)
	m.fields, m.sorted, m.tags = m.fields[:0], m.sorted[:0], m.tags[:0]
	m.enc.Reset()
	m.cur = 0
	putMapper(m)
}

// fast maps the whole body with one decoder and returns its entry
// count. It reports false, leaving m to be discarded, as soon as a line
// is bad. It does not know physical line numbers: m.cur counts entries,
// which is only seen in the errors that end it (a conflict names the
// earlier line), so they never show.
func (m *mapper) fast(body []byte) (int, bool) {
	dec := lp.NewDecoderWithBytes(body)
	n := 0
	for dec.Next() {
		n++
		m.cur = n
		if _, ve := m.entry(dec); ve != nil {
			return 0, false
		}
	}
	return n, true
}

// reject records a bad line and its dead letter.
func (m *mapper) reject(l rawLine, dev string, ve *buckets.ValidationError) {
	le := linemsg.LineError{Line: l.number, Err: ve}
	m.res.Rejected = append(m.res.Rejected, le)
	if ve.Code == linemsg.CodeDeviceNotAllowed {
		return
	}
	if buckets.DeviceID(dev).Validate() != nil {
		dev = ""
	}
	data := bytes.Clone(l.text)
	m.res.DeadLetters = append(m.res.DeadLetters, linemsg.Message{
		Device:     dev,
		DeadLetter: true,
		Code:       ve.Code,
		Reason:     headerValue(le.Error()),
		Data:       data,
		MsgID:      msgID("rejected\x00"+dev, data, strconv.Itoa(l.number)),
	})
}

// name returns the interned value name <measurement><sep><key>, or why
// it is not a valid value name.
func (m *mapper) name(meas, key []byte) (string, *buckets.ValidationError) {
	m.nameBuf = append(append(append(m.nameBuf[:0], meas...), m.sep), key...)
	if n, ok := m.names[string(m.nameBuf)]; ok {
		return n, nil
	}
	if ve, ok := m.badName[string(m.nameBuf)]; ok {
		return "", ve
	}
	n := string(m.nameBuf)
	if err := buckets.ValidateValueName(n); err != nil {
		ve := err.(*buckets.ValidationError)
		m.badName[n] = ve
		return "", ve
	}
	m.names[n] = n
	return n, nil
}

// line validates one entry and merges it into the request's readings.
// dev is the device, as far as it was found (for the dead letter).
func (m *mapper) line(text []byte) (dev string, _ *buckets.ValidationError) {
	dec := lp.NewDecoderWithBytes(text)
	if !dec.Next() {
		return "", syntax(errors.New("empty line"))
	}
	return m.entry(dec)
}

// entry validates the entry dec stands on and merges it.
func (m *mapper) entry(dec *lp.Decoder) (dev string, _ *buckets.ValidationError) {
	meas, err := dec.Measurement()
	if err != nil {
		return "", syntax(err)
	}
	// The decoder's slices are valid only until its next call: keep a
	// copy of the measurement.
	if !bytes.Equal(meas, m.slotMeas) {
		m.slotMeas = append(m.slotMeas[:0], meas...)
		m.slots = m.slots[:0]
	}
	meas = m.slotMeas
	m.fields, m.tags, m.tagBuf = m.fields[:0], m.tags[:0], m.tagBuf[:0]
	devTag := len(m.opts.DeviceTags)
	// dev is the device tag's value, for the dead letter of a bad line.
	devOf := func() string {
		if devTag == len(m.opts.DeviceTags) {
			return ""
		}
		return string(m.devBuf)
	}
	for {
		k, v, err := dec.NextTag()
		if err != nil {
			return devOf(), syntax(err)
		}
		if k == nil {
			break
		}
		if i := indexOf(m.opts.DeviceTags, k); i >= 0 && i < devTag {
			if devTag < len(m.opts.DeviceTags) {
				// A device tag of lower rank becomes a value.
				m.addTag([]byte(m.opts.DeviceTags[devTag]), m.devBuf)
			}
			devTag, m.devBuf = i, append(m.devBuf[:0], v...)
			continue
		}
		m.addTag(k, v)
	}
	for i := range m.tags {
		t := &m.tags[i]
		t.key = m.tagBuf[t.start:t.end:t.end]
	}
	slot := 0
	for {
		k, v, err := dec.NextField()
		if err != nil {
			if errors.Is(err, lp.ErrValueOutOfRange) {
				return devOf(), invalid(buckets.CodeInvalidValue, "", "%s", decodeMsg(err))
			}
			return devOf(), syntax(err)
		}
		if k == nil {
			break
		}
		val, ve := fieldValue(v)
		if ve != nil {
			ve.Field = "field " + string(k)
			return devOf(), ve
		}
		name, ve := m.nameAt(slot, meas, k)
		slot++
		if ve != nil {
			return devOf(), ve
		}
		if ve := valueOK(name, val); ve != nil {
			return devOf(), ve
		}
		m.fields = append(m.fields, buckets.Field{Name: name, Value: val})
	}
	tb, err := dec.TimeBytes()
	if err != nil {
		return devOf(), syntax(err)
	}
	if devTag == len(m.opts.DeviceTags) {
		return "", invalid(buckets.CodeInvalidDevice, "tags", "no device tag: want one of %v", m.opts.DeviceTags)
	}
	di, ve := m.device(devTag)
	if ve != nil {
		return devOf(), ve
	}
	if m.opts.Tags == linemsg.TagsAsValues {
		for _, t := range m.tags {
			name, ve := m.nameAt(slot, meas, t.key)
			slot++
			if ve != nil {
				return devOf(), ve
			}
			val := buckets.String(t.value)
			if ve := valueOK(name, val); ve != nil {
				return devOf(), ve
			}
			m.fields = append(m.fields, buckets.Field{Name: name, Value: val})
		}
	} else if ve := m.tagAttributes(); ve != nil {
		return devOf(), ve
	}
	id := string(m.devs[di].id)
	switch n := len(m.fields); {
	case n == 0:
		return id, invalid(buckets.CodeNoValues, "values", "a reading needs at least one value")
	case n > buckets.MaxValues:
		return id, invalid(buckets.CodeTooManyValues, "values", "%d values is more than %d", n, buckets.MaxValues)
	}
	fields, dup := m.sortFields()
	if dup != "" {
		return id, invalid(buckets.CodeDuplicateValue, dup, "the line gives this value name twice (a tag and a field, or a field twice)")
	}
	ticks, ve := m.ticks(tb)
	if ve != nil {
		return id, ve
	}
	if !ticks.Valid() {
		return id, invalid(buckets.CodeInvalidTime, "timestamp", "tick count %d is outside 0001..9999", int64(ticks))
	}
	if !m.window || ticks < m.lo || ticks > m.hi {
		if err := m.opts.Window.Check(ticks, m.opts.Now); err != nil {
			var ve *buckets.ValidationError
			if errors.As(err, &ve) {
				return id, ve
			}
			return id, invalid(buckets.CodeInvalidTime, "timestamp", "%s", err.Error())
		}
	}
	return id, m.merge(di, ticks, fields, int32(m.cur))
}

// addTag adds a tag other than the device tag to m.tags: its key to
// m.tagBuf, its value interned (a request repeats its tag values).
func (m *mapper) addTag(k, v []byte) {
	start := len(m.tagBuf)
	m.tagBuf = append(m.tagBuf, k...)
	val, ok := m.tagVals[string(v)]
	if !ok {
		val = string(v)
		m.tagVals[val] = val
	}
	m.tags = append(m.tags, tagKV{value: val, start: start, end: len(m.tagBuf)})
}

// sortFields returns the values of the line (m.fields) sorted by name,
// or the first name given twice. Lines of a batch mostly give the same
// names in the same order: their order is then the previous line's.
func (m *mapper) sortFields() ([]buckets.Field, string) {
	fs := m.fields
	if !m.permOK || len(m.perm) != len(fs) {
		m.perm = m.perm[:0]
		for i := range fs {
			m.perm = append(m.perm, i)
		}
		slices.SortStableFunc(m.perm, func(a, b int) int { return strings.Compare(fs[a].Name, fs[b].Name) })
		for i := 1; i < len(m.perm); i++ {
			if fs[m.perm[i]].Name == fs[m.perm[i-1]].Name {
				m.permOK = false
				return nil, fs[m.perm[i]].Name
			}
		}
		m.permOK = true
	}
	m.sorted = m.sorted[:0]
	for _, i := range m.perm {
		m.sorted = append(m.sorted, fs[i])
	}
	return m.sorted, ""
}

// nameAt is name for the key at position slot of the line, through the
// previous line's names.
func (m *mapper) nameAt(slot int, meas, key []byte) (string, *buckets.ValidationError) {
	if slot < len(m.slots) && bytes.Equal(m.slots[slot].key, key) {
		return m.slots[slot].name, nil
	}
	n, ve := m.name(meas, key)
	if ve != nil {
		return "", ve
	}
	m.permOK = false // the slots change: the names of the next line are new
	switch {
	case slot < len(m.slots):
		m.slots[slot] = nameSlot{key: append(m.slots[slot].key[:0], key...), name: n}
	case slot == len(m.slots):
		m.slots = append(m.slots, nameSlot{key: append([]byte(nil), key...), name: n})
	}
	return n, nil
}

// device returns the index in m.devs of the device the line's tag
// devTag names (in m.devBuf), checked once per request: a valid ID the
// writer may write.
func (m *mapper) device(devTag int) (int32, *buckets.ValidationError) {
	i, ok := m.lastDev, m.lastDev >= 0 && string(m.devs[m.lastDev].id) == string(m.devBuf)
	if !ok {
		i, ok = m.devByID[string(m.devBuf)]
	}
	if !ok {
		d := devInfo{id: buckets.DeviceID(m.devBuf), group: -1}
		if err := d.id.Validate(); err != nil {
			d.invalid = err.(*buckets.ValidationError)
		}
		d.allowed = m.opts.Allow == nil || d.invalid != nil || m.opts.Allow(string(d.id))
		i = int32(len(m.devs))
		m.devs = append(m.devs, d)
		m.devByID[string(d.id)] = i
	}
	m.lastDev = i
	d := &m.devs[i]
	if d.invalid != nil {
		ve := *d.invalid
		ve.Field = "tag " + m.opts.DeviceTags[devTag]
		return i, &ve
	}
	if !d.allowed {
		return i, invalid(linemsg.CodeDeviceNotAllowed, "tag "+m.opts.DeviceTags[devTag], "the token may not write for device %q", d.id)
	}
	return i, nil
}

// valueOK validates one value, naming it.
func valueOK(name string, v buckets.Value) *buckets.ValidationError {
	if err := v.Validate(); err != nil {
		ve := err.(*buckets.ValidationError)
		ve.Field = "values." + name
		return ve
	}
	return nil
}

// ticks converts the line's timestamp (or Now) to ticks.
func (m *mapper) ticks(tb []byte) (buckets.Ticks, *buckets.ValidationError) {
	if tb == nil {
		return m.nowTicks, m.nowErr
	}
	n, ok := parseInt(tb)
	if !ok {
		return 0, invalid(buckets.CodeInvalidTime, "timestamp", "%q is not an integer in range", tb)
	}
	p := int64(m.opts.Precision)
	if n > math.MaxInt64/p || n < math.MinInt64/p {
		return 0, invalid(buckets.CodeInvalidTime, "timestamp", "%d at precision %s is out of range", n, m.opts.Precision)
	}
	return unixNanoTicks(n * p), nil
}

// unixEpoch is 1970-01-01 in ticks.
var unixEpoch = buckets.MustTicks(time.Unix(0, 0))

// unixNanoTicks is buckets.TicksOf(time.Unix(0, ns)): every int64 of
// nanoseconds is inside 0001..9999, and ticks truncate towards the
// past.
func unixNanoTicks(ns int64) buckets.Ticks {
	q := ns / 100
	if ns%100 < 0 {
		q--
	}
	return unixEpoch + buckets.Ticks(q)
}

// parseInt is strconv.ParseInt(string(b), 10, 64) without its error
// value: an optional sign and at least one decimal digit, in range.
func parseInt(b []byte) (int64, bool) {
	neg := false
	if len(b) > 0 && (b[0] == '+' || b[0] == '-') {
		neg = b[0] == '-'
		b = b[1:]
	}
	if len(b) == 0 {
		return 0, false
	}
	const limit = uint64(1) << 63 // |math.MinInt64|
	var u uint64
	for _, c := range b {
		if c < '0' || c > '9' || u > limit/10 {
			return 0, false
		}
		u = u*10 + uint64(c-'0')
		if u > limit {
			return 0, false
		}
	}
	if neg {
		return int64(-u), true // -(1<<63) wraps to math.MinInt64
	}
	if u == limit {
		return 0, false
	}
	return int64(u), true
}

// merge adds the sorted fields and attributes (m.attrs) of a line to
// the request's reading of the same device and time, unless one of them
// conflicts with an earlier line.
func (m *mapper) merge(dev int32, ticks buckets.Ticks, fields []buckets.Field, line int32) *buckets.ValidationError {
	key := readingKey{dev, ticks}
	d := &m.devs[dev]
	var g *deviceReadings
	if d.group >= 0 {
		g = &m.devices[d.group]
	}
	newNames := 0 // attribute names the device's earlier lines did not give
	if len(m.attrs) > 0 {
		if newNames = m.newAttrNames(g); g != nil && len(g.attrNames)+newNames > buckets.MaxAttributes {
			return invalid(buckets.CodeTooManyAttributes, "tags", "with the earlier lines of device %q this request names %d attributes, more than %d",
				d.id, len(g.attrNames)+newNames, buckets.MaxAttributes)
		}
	}
	pi, ok := int32(0), false
	if g != nil && ticks == g.last && m.pending[g.readings[len(g.readings)-1]].ticks == ticks {
		// The device's latest line, again (TSBS's two lines per time):
		// no index needed.
		pi, ok = g.readings[len(g.readings)-1], true
	} else if g != nil && ticks <= g.last {
		if !g.indexed {
			if m.index == nil {
				m.index = make(map[readingKey]int32)
			}
			for _, i := range g.readings {
				m.index[readingKey{dev, m.pending[i].ticks}] = i
			}
			g.indexed = true
		}
		pi, ok = m.index[key]
	}
	if !ok {
		spare := 0
		if g != nil {
			spare = g.spare
		}
		vs := m.values.alloc(len(fields) + spare)[:len(fields)]
		copy(vs, fields)
		p := pending{ticks: ticks, fields: vs, line: line}
		if len(m.attrs) > 0 {
			start := len(m.attrArena)
			m.attrArena = append(m.attrArena, m.attrs...)
			p.attrs = m.attrArena[start:len(m.attrArena):len(m.attrArena)]
		}
		pi = int32(len(m.pending))
		m.pending = append(m.pending, p)
		if g == nil {
			d.group = int32(len(m.devices))
			if len(m.devices) < cap(m.devices) { // keep the readings buffer of a previous request
				m.devices = m.devices[:len(m.devices)+1]
			} else {
				m.devices = append(m.devices, deviceReadings{})
			}
			g = &m.devices[d.group]
			*g = deviceReadings{id: d.id, last: ticks, readings: g.readings[:0], attrNames: g.attrNames[:0]}
		}
		if newNames > 0 {
			m.addAttrNames(g)
		}
		if g.indexed {
			m.index[key] = pi
		}
		if ticks < g.last {
			g.unsorted = true
		}
		g.last = max(g.last, ticks)
		g.readings = append(g.readings, pi)
		return nil
	}
	p := &m.pending[pi]
	added, ve := p.fieldConflict(fields)
	if ve != nil {
		return ve
	}
	if len(p.fields)+added > buckets.MaxValues {
		return invalid(buckets.CodeTooManyValues, "", "merged with earlier lines of the same device and time this reading has %d values, more than %d",
			len(p.fields)+added, buckets.MaxValues)
	}
	missing, ve := p.attrConflict(m.attrs)
	if ve != nil {
		return ve
	}
	m.mergeFields(p, fields, added, line)
	g.spare = added
	if missing > 0 {
		p.mergeAttrs(m.attrs)
	}
	if newNames > 0 {
		m.addAttrNames(g)
	}
	return nil
}

// fieldConflict counts the values of fields (sorted by name) that p
// lacks, or reports the first that an earlier line gave another value.
func (p *pending) fieldConflict(fields []buckets.Field) (added int, _ *buckets.ValidationError) {
	i := 0
	for _, f := range fields {
		for i < len(p.fields) && p.fields[i].Name < f.Name {
			i++
		}
		if i == len(p.fields) || p.fields[i].Name != f.Name {
			added++
			continue
		}
		if p.fields[i].Value != f.Value {
			return 0, invalid(CodeConflictingLines, f.Name, "line %d gives %v at the same device and time; this line gives %v",
				p.lineOf(i), p.fields[i].Value.Any(), f.Value.Any())
		}
	}
	return added, nil
}

// mergeFields merges the sorted fields of line into p's, added of them
// new to p (none conflicts): in place when p's values have room for
// them (deviceReadings.spare), else into a new slice of the arena; their
// lines always go in a new slice.
func (m *mapper) mergeFields(p *pending, fields []buckets.Field, added int, line int32) {
	if added == 0 {
		return
	}
	n := len(p.fields) + added
	ls := m.lineNos.alloc(n)
	if n <= cap(p.fields) {
		// From the end, so that no value of p is overwritten before it
		// is moved: the k-th slot is never before the i-th.
		vs := p.fields[:n]
		i, j := len(p.fields)-1, len(fields)-1
		for k := n - 1; k >= 0; k-- {
			if i < 0 || (j >= 0 && fields[j].Name > p.fields[i].Name) {
				vs[k], ls[k] = fields[j], line
				j--
				continue
			}
			if j >= 0 && fields[j].Name == p.fields[i].Name {
				j-- // the same value (no conflict): keep the earlier line's
			}
			vs[k], ls[k] = p.fields[i], p.lineOf(i)
			i--
		}
		p.fields, p.lines = vs, ls
		return
	}
	vs := m.values.alloc(n)
	i, j := 0, 0
	for k := range vs {
		if j == len(fields) || (i < len(p.fields) && p.fields[i].Name <= fields[j].Name) {
			if j < len(fields) && p.fields[i].Name == fields[j].Name {
				j++ // the same value (no conflict): keep the earlier line's
			}
			vs[k], ls[k] = p.fields[i], p.lineOf(i)
			i++
			continue
		}
		vs[k], ls[k] = fields[j], line
		j++
	}
	p.fields, p.lines = vs, ls
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
