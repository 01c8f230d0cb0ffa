package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telemetryd/telemetryd/buckets"
)

// The "tsbs" phase (-phases tsbs -tsbs FILE) sends a TSBS IoT file
// through the whole service: its lines merge into readings as in the
// -tsbs store measurement (eachTSBSMessage), 100 readings of one device
// form a JSON message of ingest/README.md (an array of flat readings)
// on telemetry.<device>, and each run publishes all of them with
// JetStream publish acks to a fresh service and measures publish to
// stored, as the e2e phase does. With -compare B the runs alternate
// between -binary (A, first) and B, -repeat times each, so that a noisy
// moment of the machine hits both; the report gives B/A.

// tsbsRunName is the end-to-end configuration of the tsbs phase.
const tsbsRunName = "TSBS IoT 100/msg"

// tsbsMessages is a TSBS file as the JSON messages a fleet publishes.
type tsbsMessages struct {
	subjects []string
	payloads [][]byte
	before   []int // before[m]: readings in messages [0, m)
	readings int   // distinct (device, time): what the service stores
	values   int   // field values in the readings (tags not counted)
	// shift moves the file's times by whole days so that its last
	// reading lies just before the run (see tsbsShift).
	shift       time.Duration
	first, last time.Time // after the shift
}

func (t *tsbsMessages) count() int               { return len(t.payloads) }
func (t *tsbsMessages) readingsBefore(m int) int { return t.before[m] }
func (t *tsbsMessages) natsMsg(m int) *nats.Msg {
	return &nats.Msg{Subject: t.subjects[m], Data: t.payloads[m]}
}

// tsbsRetention is how far back the shifted data may reach: a day
// inside the service's default retention of 30 days.
const tsbsRetention = 29 * 24 * time.Hour

// loadTSBSMessages reads file into messages of tsbsMsg readings, with
// every time moved by tsbsShift(its newest time, now), counting them on
// ph (nil: no progress). Tags are string values, as appendTSBSPayload
// writes them.
func loadTSBSMessages(file string, now time.Time, ph *phase) (*tsbsMessages, error) {
	return loadTSBSMessagesAs(file, now, ph, appendTSBSPayload)
}

// loadTSBSMessagesAs is loadTSBSMessages with the payloads written by
// encode.
func loadTSBSMessagesAs(file string, now time.Time, ph *phase, encode func(dst []byte, readings []buckets.Reading) []byte) (*tsbsMessages, error) {
	newest, err := tsbsNewest(file)
	if err != nil {
		return nil, err
	}
	t := &tsbsMessages{shift: tsbsShift(newest, now), before: []int{0}}
	shift := buckets.Ticks(t.shift / 100) // ticks are 100 ns
	type key struct {
		dev buckets.DeviceID
		at  buckets.Ticks
	}
	seen := map[key]struct{}{}
	lo, hi := buckets.Ticks(math.MaxInt64), buckets.Ticks(math.MinInt64)
	err = eachTSBSMessage(file, func(msg []buckets.Reading, values int) error {
		for i := range msg {
			r := &msg[i]
			r.Ticks += shift
			if err := r.Validate(); err != nil {
				return fmt.Errorf("tsbs: reading of %s at %s: %w", r.Device, r.Ticks.FormatTime(), err)
			}
			seen[key{r.Device, r.Ticks}] = struct{}{}
			lo, hi = min(lo, r.Ticks), max(hi, r.Ticks)
		}
		t.subjects = append(t.subjects, "telemetry."+string(msg[0].Device))
		t.payloads = append(t.payloads, encode(nil, msg))
		t.before = append(t.before, t.before[len(t.before)-1]+len(msg))
		t.values += values
		ph.add(1)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(seen) == 0 {
		return nil, fmt.Errorf("tsbs: %s holds no reading with a name tag and a field", file)
	}
	t.readings, t.first, t.last = len(seen), lo.Time(), hi.Time()
	if t.first.Before(now.Add(-tsbsRetention)) {
		return nil, fmt.Errorf("tsbs: %s spans %s, more than the %s the service keeps",
			file, t.last.Sub(t.first), tsbsRetention)
	}
	return t, nil
}

// tsbsNewest is the newest line time of a line protocol file (the last
// space-separated field of each line, in nanoseconds).
func tsbsNewest(file string) (time.Time, error) {
	f, err := os.Open(file)
	if err != nil {
		return time.Time{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(bufio.NewReaderSize(f, 1<<20))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	newest, n := int64(math.MinInt64), 0
	for sc.Scan() {
		n++
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		ts, err := strconv.ParseInt(string(line[bytes.LastIndexByte(line, ' ')+1:]), 10, 64)
		if err != nil {
			return time.Time{}, fmt.Errorf("tsbs: %s line %d: want a time in nanoseconds at the end of the line", file, n)
		}
		newest = max(newest, ts)
	}
	if err := sc.Err(); err != nil {
		return time.Time{}, fmt.Errorf("tsbs: %s line %d: %w", file, n+1, err)
	}
	if newest == math.MinInt64 {
		return time.Time{}, fmt.Errorf("tsbs: %s holds no line", file)
	}
	return time.Unix(0, newest).UTC(), nil
}

// tsbsShift is the whole number of days that moves newest to the
// latest time at least a minute before now: the data keeps its times
// of day (and so its hour blocks), lies inside the service's accepted
// window (nothing in the future, today's or yesterday's tables hot),
// and a file generated for the current day is sent unchanged.
func tsbsShift(newest, now time.Time) time.Duration {
	const day = 24 * time.Hour
	gap := now.Add(-time.Minute).Sub(newest)
	return time.Duration(math.Floor(float64(gap)/float64(day))) * day
}

// appendTSBSPayload appends readings as a JSON array of flat readings
// (ingest/README.md): "ts" in epoch milliseconds when the time is a
// whole millisecond (RFC 3339 otherwise), every value under its name.
// Floats always carry a fraction or an exponent, so that the service
// decodes them as floats, as line protocol has them. The readings must
// be valid (buckets.Reading.Validate): their names need no escaping.
func appendTSBSPayload(dst []byte, readings []buckets.Reading) []byte {
	dst = append(dst, '[')
	for i, r := range readings {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = append(dst, `{"ts":`...)
		if r.Ticks%10_000 == 0 {
			dst = strconv.AppendInt(dst, r.Ticks.Time().UnixMilli(), 10)
		} else {
			dst = appendJSONString(dst, r.Ticks.FormatTime())
		}
		for _, f := range r.Values {
			dst = append(dst, ",\""...)
			dst = append(dst, f.Name...)
			dst = append(dst, "\":"...)
			dst = appendJSONValue(dst, f.Value)
		}
		dst = append(dst, '}')
	}
	return append(dst, ']')
}

// appendJSONValue appends v as a JSON literal.
func appendJSONValue(dst []byte, v buckets.Value) []byte {
	switch v.Kind {
	case buckets.KindFloat:
		start := len(dst)
		dst = strconv.AppendFloat(dst, v.AsFloat(), 'g', -1, 64)
		if !bytes.ContainsAny(dst[start:], ".e") {
			dst = append(dst, ".0"...)
		}
		return dst
	case buckets.KindInt:
		return strconv.AppendInt(dst, v.AsInt(), 10)
	case buckets.KindBool:
		return strconv.AppendBool(dst, v.AsBool())
	default:
		return appendJSONString(dst, v.AsString())
	}
}

// appendJSONString appends s as a JSON string.
func appendJSONString(dst []byte, s string) []byte {
	b, _ := json.Marshal(s) // a string always marshals (invalid UTF-8 becomes U+FFFD)
	return append(dst, b...)
}

// tsbsE2E is one end-to-end run of the tsbs phase.
type tsbsE2E struct {
	Label  string // "A" (-binary) or "B" (-compare)
	Bin    string
	Values int // field values in the readings
	e2eResult
}

// runTSBSE2E runs the tsbs phase.
func (b *bench) runTSBSE2E(ctx context.Context) error {
	if err := b.ensureBinary(ctx); err != nil {
		return err
	}
	ph := b.prog.begin("tsbs: "+b.cfg.TSBSFile+" into JSON messages", 0, "messages")
	msgs, err := loadTSBSMessages(b.cfg.TSBSFile, time.Now(), ph)
	if err != nil {
		return err
	}
	debug.FreeOSMemory() // the parser's garbage, before the services run
	b.res.TSBSData = tsbsData{File: b.cfg.TSBSFile, Messages: msgs.count(), Readings: msgs.readings,
		Values: msgs.values, Shift: msgs.shift, First: msgs.first, Last: msgs.last}
	ph.end(fmt.Sprintf("%d messages, %d readings, %d field values, %s to %s (moved by %s)", msgs.count(), msgs.readings,
		msgs.values, msgs.first.Format(time.RFC3339), msgs.last.Format(time.RFC3339), msgs.shift))
	bins := []struct{ label, bin string }{{"A", b.bin}, {"B", b.cfg.Compare}}
	if b.cfg.Compare == "" {
		bins = bins[:1]
	}
	run := e2eRun{Name: tsbsRunName, PerMsg: tsbsMsg, Telemetry: true}
	for rep := range b.cfg.Repeat {
		for _, x := range bins {
			name := fmt.Sprintf("tsbs-%s-%d", x.label, rep+1)
			r, err := b.e2eOnce(ctx, run, x.bin, name, msgs, msgs.readings)
			removeAll(filepath.Join(b.work, name), b.cfg.Keep)
			if err != nil {
				return fmt.Errorf("%s, %s %s: %w", run.Name, x.label, x.bin, err)
			}
			b.res.TSBS = append(b.res.TSBS, tsbsE2E{Label: x.label, Bin: x.bin, Values: msgs.values, e2eResult: r})
		}
	}
	return nil
}

// tsbsData describes the data of the tsbs phase.
type tsbsData struct {
	File                       string
	Messages, Readings, Values int
	Shift                      time.Duration
	First, Last                time.Time
}

// tsbsSection is the report table of the tsbs phase: every run in the
// order run, the median and range of each build, and B/A.
func tsbsSection(r *Results) section {
	d := r.TSBSData
	s := section{title: fmt.Sprintf("TSBS IoT end to end, %d readings per message: publish to stored", tsbsMsg),
		header: []string{"run", "build", "publish alone/s", "publish to stored/s", "service CPU s per M readings",
			"service peak RSS", "disk B/reading", "disk B/value"}}
	byLabel := map[string][]tsbsE2E{}
	for i, t := range r.TSBS {
		byLabel[t.Label] = append(byLabel[t.Label], t)
		s.rows = append(s.rows, []string{strconv.Itoa(i + 1), t.Label + " " + filepath.Base(t.Bin), num(t.PublishRate), num(t.Rate),
			fmt.Sprintf("%.2f", cpuPerMillion(t.ServiceCPU, t.Readings)), mib(t.PeakRSS),
			fmt.Sprintf("%.2f", float64(t.DiskBytes)/float64(t.Readings)), fmt.Sprintf("%.3f", float64(t.DiskBytes)/float64(t.Values))})
	}
	for _, label := range []string{"A", "B"} {
		runs := byLabel[label]
		if len(runs) == 0 {
			continue
		}
		rate := spread(runs, func(t tsbsE2E) float64 { return t.Rate })
		s.rows = append(s.rows, []string{"median", label, num(medianBy(runs, func(t tsbsE2E) float64 { return t.PublishRate })),
			fmt.Sprintf("%s (%s-%s)", num(rate[1]), num(rate[0]), num(rate[2])),
			fmt.Sprintf("%.2f", medianBy(runs, func(t tsbsE2E) float64 { return cpuPerMillion(t.ServiceCPU, t.Readings) })),
			mib(int64(medianBy(runs, func(t tsbsE2E) float64 { return float64(t.PeakRSS) }))),
			fmt.Sprintf("%.2f", medianBy(runs, func(t tsbsE2E) float64 { return float64(t.DiskBytes) / float64(t.Readings) })),
			fmt.Sprintf("%.3f", medianBy(runs, func(t tsbsE2E) float64 { return float64(t.DiskBytes) / float64(t.Values) }))})
	}
	s.notes = append(s.notes, fmt.Sprintf("%s: %s messages, %s readings (lines merged per truck and time), %s field values; times %s to %s (moved by %s).",
		d.File, num(float64(d.Messages)), num(float64(d.Readings)), num(float64(d.Values)),
		d.First.Format(time.RFC3339), d.Last.Format(time.RFC3339), d.Shift))
	if a, b := byLabel["A"], byLabel["B"]; len(a) > 0 && len(b) > 0 {
		rate := func(t tsbsE2E) float64 { return t.Rate }
		cpu := func(t tsbsE2E) float64 { return cpuPerMillion(t.ServiceCPU, t.Readings) }
		var pairs []float64 // B/A of the runs of each round
		for i := range min(len(a), len(b)) {
			pairs = append(pairs, b[i].Rate/a[i].Rate)
		}
		slices.Sort(pairs)
		s.notes = append(s.notes, fmt.Sprintf("B/A, publish to stored: %s of the medians; per pair (run one after the other) %s-%s, median %s. Service CPU per reading B/A: %s.",
			ratio(medianBy(b, rate), medianBy(a, rate)), ratio(pairs[0], 1), ratio(pairs[len(pairs)-1], 1),
			ratio(median(pairs), 1), ratio(medianBy(b, cpu), medianBy(a, cpu))))
	}
	s.notes = append(s.notes, "Disk is the day tables after the service stopped; B/value divides by the field values only (the stored tag strings included in the bytes).")
	return s
}

// medianBy is the median of f over xs.
func medianBy[T any](xs []T, f func(T) float64) float64 {
	v := make([]float64, len(xs))
	for i, x := range xs {
		v[i] = f(x)
	}
	return median(v)
}

// spread is the minimum, median and maximum of f over xs.
func spread[T any](xs []T, f func(T) float64) [3]float64 {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range xs {
		lo, hi = min(lo, f(x)), max(hi, f(x))
	}
	return [3]float64{lo, medianBy(xs, f), hi}
}
