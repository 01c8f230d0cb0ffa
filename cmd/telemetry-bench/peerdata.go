package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// peerLinesPerRequest is the size of each line protocol request of the
// peer comparison, to either service.
const peerLinesPerRequest = 10_000

// peerData is a TSBS IoT file as both services are sent it.
type peerData struct {
	file string
	// bodies are the file's lines in requests of peerLinesPerRequest,
	// every time moved by shift. Lines without a name tag belong to no
	// truck (the generator leaves a tag out now and then): they are
	// left out for both services.
	bodies  [][]byte
	lines   int
	dropped int // lines without a name tag
	// json is the same readings as JSON messages of 100 readings; with
	// attrs, tags are the readings' attributes, else string values.
	json  *tsbsMessages
	attrs bool
	// velocity and status count the lines carrying each of those
	// fields: the peer is queryable when it counts as many samples.
	velocity, status int
	trucks           []string
	shift            time.Duration
	end              time.Time // the newest line time after the shift
}

// loadPeerData reads file for the peer comparison; times move by
// tsbsShift(the newest time, now), as in the tsbs phase.
func loadPeerData(file string, now time.Time, attrs bool, ph *phase) (*peerData, error) {
	encode := appendTSBSPayload
	if attrs {
		encode = appendTSBSAttrPayload
	}
	msgs, err := loadTSBSMessagesAs(file, now, ph, encode)
	if err != nil {
		return nil, err
	}
	d := &peerData{file: file, json: msgs, attrs: attrs, shift: msgs.shift, end: msgs.last}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	sc := bufio.NewScanner(bufio.NewReaderSize(f, 1<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	trucks := map[string]bool{}
	var body []byte
	n, inBody := 0, 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		key, rest, ok := bytes.Cut(line, []byte{' '})
		sp := bytes.LastIndexByte(rest, ' ')
		if !ok || sp < 0 {
			return nil, fmt.Errorf("peer: %s line %d: want `<measurement>,<tags> <fields> <time>`", file, n)
		}
		truck := tagValue(key, "name")
		if truck == "" {
			d.dropped++
			continue
		}
		trucks[truck] = true
		ts, err := strconv.ParseInt(string(rest[sp+1:]), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("peer: %s line %d: want a time in nanoseconds at the end of the line", file, n)
		}
		fields := rest[:sp]
		switch {
		case bytes.HasPrefix(key, []byte("readings,")) && hasField(fields, "velocity"):
			d.velocity++
		case bytes.HasPrefix(key, []byte("diagnostics,")) && hasField(fields, "status"):
			d.status++
		}
		body = append(body, line[:len(key)+1+sp+1]...)
		body = strconv.AppendInt(body, ts+int64(d.shift), 10)
		body = append(body, '\n')
		d.lines++
		if inBody++; inBody == peerLinesPerRequest {
			d.bodies = append(d.bodies, body)
			body, inBody = nil, 0
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("peer: %s line %d: %w", file, n+1, err)
	}
	if inBody > 0 {
		d.bodies = append(d.bodies, body)
	}
	for t := range trucks {
		d.trucks = append(d.trucks, t)
	}
	slices.Sort(d.trucks)
	return d, nil
}

// tagValue is the value of tag name in a series key
// `<measurement>,<k>=<v>,...` (TSBS writes no escapes), "" if absent.
func tagValue(key []byte, name string) string {
	for kv := range bytes.SplitSeq(key, []byte{','}) {
		if k, v, ok := bytes.Cut(kv, []byte{'='}); ok && string(k) == name {
			return string(v)
		}
	}
	return ""
}

// hasField reports whether a line's field set holds field name.
func hasField(fields []byte, name string) bool {
	for kv := range bytes.SplitSeq(fields, []byte{','}) {
		if k, _, ok := bytes.Cut(kv, []byte{'='}); ok && string(k) == name {
			return true
		}
	}
	return false
}

// appendTSBSAttrPayload is appendTSBSPayload for a service with device
// attributes: the string values (TSBS's tags, <measurement>.<tag>) of
// the message's readings become the "attributes" object of its first
// reading, as a device that states its attributes with each batch.
func appendTSBSAttrPayload(dst []byte, readings []buckets.Reading) []byte {
	attrs := map[string]string{}
	plain := make([]buckets.Reading, len(readings))
	for i, r := range readings {
		plain[i] = r
		plain[i].Values = nil
		for _, f := range r.Values {
			if f.Value.Kind != buckets.KindString {
				plain[i].Values = append(plain[i].Values, f)
				continue
			}
			_, tag, _ := strings.Cut(f.Name, ".")
			attrs[tag] = f.Value.AsString()
		}
	}
	out := appendTSBSPayload(dst, plain)
	if len(attrs) == 0 {
		return out
	}
	// Insert the attributes into the first reading: `[{"ts":...` →
	// `[{"attributes":{...},"ts":...`.
	names := make([]string, 0, len(attrs))
	for k := range attrs {
		names = append(names, k)
	}
	slices.Sort(names)
	obj := []byte(`{"attributes":{`)
	for i, k := range names {
		if i > 0 {
			obj = append(obj, ',')
		}
		obj = appendJSONString(obj, k)
		obj = append(obj, ':')
		obj = appendJSONString(obj, attrs[k])
	}
	obj = append(obj, "},"...)
	head := len(dst) + 2 // past `[{`
	return slices.Concat(out[:len(dst)+1], obj, out[head:])
}
