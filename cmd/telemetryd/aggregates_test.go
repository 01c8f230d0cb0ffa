package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// unixEpoch is 1970-01-01T00:00:00Z in ticks: buckets align to it.
var unixEpoch = buckets.MustTicks(time.Unix(0, 0))

// bucketStart returns the start of the interval-wide bucket holding k.
func bucketStart(k, interval buckets.Ticks) buckets.Ticks {
	d := k - unixEpoch
	q := d / interval
	if d%interval < 0 {
		q--
	}
	return unixEpoch + q*interval
}

// aggResponse is the JSON of GET /v1/devices/{device}/aggregates.
type aggResponse struct {
	Device   string `json:"device"`
	Interval string `json:"interval"`
	Buckets  []struct {
		Start  time.Time                             `json:"start"`
		Values map[string]map[string]json.RawMessage `json:"values"`
	} `json:"buckets"`
	Next string `json:"next"`
}

var aggFns = []string{"count", "sum", "min", "max", "avg", "first", "last"}

// aggModel is the brute-force side: every stored reading after merges.
type aggModel map[buckets.DeviceID]map[buckets.Ticks][]buckets.Field

func (m aggModel) apply(r buckets.Reading) {
	if m[r.Device] == nil {
		m[r.Device] = map[buckets.Ticks][]buckets.Field{}
	}
	m[r.Device][r.Ticks] = buckets.Merge(m[r.Device][r.Ticks], slices.Clone(r.Values))
}

// expBucket is one expected bucket.
type expBucket struct {
	start  buckets.Ticks
	values map[string]*buckets.Summary
}

// expect computes the buckets of dev for [from, to) by brute force.
func (m aggModel) expect(dev buckets.DeviceID, from, to, interval buckets.Ticks, fields []string) []expBucket {
	byStart := map[buckets.Ticks]*expBucket{}
	for k, fs := range m[dev] {
		if k < from || k >= to {
			continue
		}
		st := bucketStart(k, interval)
		for _, f := range fs {
			v, ok := buckets.Numeric(f.Value)
			if !ok || (fields != nil && !slices.Contains(fields, f.Name)) {
				continue
			}
			b := byStart[st]
			if b == nil {
				b = &expBucket{start: st, values: map[string]*buckets.Summary{}}
				byStart[st] = b
			}
			if b.values[f.Name] == nil {
				b.values[f.Name] = &buckets.Summary{}
			}
			b.values[f.Name].Add(k, v)
		}
	}
	out := make([]expBucket, 0, len(byStart))
	for _, b := range byStart {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b expBucket) int { return int(a.start - b.start) })
	return out
}

// randomFields returns 1..4 values of random kinds and names.
func randomFields(rng *rand.Rand) []buckets.Field {
	var fs []buckets.Field
	for len(fs) == 0 {
		if rng.IntN(3) > 0 {
			fs = append(fs, buckets.Field{Name: "temp", Value: buckets.Float(math.Round(rng.NormFloat64()*1e4) / 100)})
		}
		if rng.IntN(3) == 0 {
			fs = append(fs, buckets.Field{Name: "count", Value: buckets.Int(rng.Int64N(2000) - 1000)})
		}
		if rng.IntN(3) == 0 {
			fs = append(fs, buckets.Field{Name: "ok", Value: buckets.Bool(rng.IntN(2) == 0)})
		}
		if rng.IntN(4) == 0 {
			fs = append(fs, buckets.Field{Name: "state", Value: buckets.String("s" + strconv.Itoa(rng.IntN(5)))})
		}
	}
	buckets.SortValues(fs)
	return fs
}

// TestAggregatesMatchBruteForce checks the aggregates endpoint against
// a brute-force computation over the raw readings, on the real store:
// random devices and times across day boundaries, readings written
// late (out of order) and merged (same device and time written twice),
// intervals from 1s to 7d, every fn, from/to that cut buckets, and
// pages followed through next.
func TestAggregatesMatchBruteForce(t *testing.T) {
	inLane(t, lanes.general)
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 42))
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	env := newDashEnv(t, now)
	lo := buckets.MustTicks(now.Add(-9 * 24 * time.Hour))
	hi := buckets.MustTicks(now)

	model := aggModel{}
	devs := []string{"dev-a", "dev-b", "sensor_7"}
	var first, late []buckets.Reading
	for _, dev := range devs {
		for range 300 + rng.IntN(200) {
			var k buckets.Ticks
			switch rng.IntN(4) {
			case 0: // any tick
				k = lo + buckets.Ticks(rng.Int64N(int64(hi-lo)))
			case 1: // on a whole hour or day, where buckets start
				k = bucketStart(lo+buckets.Ticks(rng.Int64N(int64(hi-lo))), buckets.Ticks([]time.Duration{time.Hour, 24 * time.Hour}[rng.IntN(2)]/100))
			default: // whole seconds, around day boundaries
				day := buckets.DayOf(lo + buckets.Ticks(rng.Int64N(int64(hi-lo))))
				k = day.Start() + buckets.Ticks(rng.Int64N(3600)-1800)*buckets.TicksPerSecond
			}
			k = max(min(k, hi-1), lo)
			r := newReading(dev, k, randomFields(rng)...)
			first = append(first, r)
			if rng.IntN(5) == 0 { // a second message for the same instant
				late = append(late, newReading(dev, k, randomFields(rng)...))
			}
		}
	}
	rng.Shuffle(len(first), func(i, j int) { first[i], first[j] = first[j], first[i] })
	rng.Shuffle(len(late), func(i, j int) { late[i], late[j] = late[j], late[i] })
	// Writes of 1..60 readings; a device and instant appears at most
	// once per write, a repeat goes to a later one (a merge).
	write := func(pending []buckets.Reading) {
		for len(pending) > 0 {
			n := min(len(pending), 1+rng.IntN(60))
			seen := map[string]bool{}
			var batch, rest []buckets.Reading
			for _, r := range pending[:n] {
				id := string(r.Device) + "/" + r.Ticks.RowKey()
				if seen[id] {
					rest = append(rest, r)
					continue
				}
				seen[id] = true
				batch = append(batch, r)
			}
			env.write(t, batch...)
			for _, r := range batch {
				model.apply(r)
			}
			pending = append(rest, pending[n:]...)
		}
	}

	intervals := []time.Duration{time.Second, 7 * time.Second, time.Minute, 5 * time.Minute, 15 * time.Minute,
		time.Hour, 6 * time.Hour, 24 * time.Hour, 2 * 24 * time.Hour, 7 * 24 * time.Hour}
	query := func(phase string, i int) {
		dev := devs[rng.IntN(len(devs))]
		iv := intervals[rng.IntN(len(intervals))]
		if rng.IntN(5) == 0 {
			iv = time.Duration(1+rng.Int64N(7*86400)) * time.Second
		}
		ivText := iv.String()
		if iv%(24*time.Hour) == 0 && rng.IntN(2) == 0 {
			ivText = strconv.Itoa(int(iv/(24*time.Hour))) + "d"
		}
		from := lo - buckets.TicksPerDay + buckets.Ticks(rng.Int64N(int64(hi-lo)+2*buckets.TicksPerDay))
		to := from + 1 + buckets.Ticks(rng.Int64N(int64(hi-lo)))
		if rng.IntN(4) == 0 { // aligned to the interval: no cut bucket
			from = bucketStart(from, buckets.Ticks(iv/100))
		}
		q := url.Values{"from": {from.FormatTime()}, "to": {to.FormatTime()}, "interval": {ivText}}
		fns := []string{"count", "min", "max", "avg"}
		if rng.IntN(4) > 0 {
			fns = nil
			for _, f := range aggFns {
				if rng.IntN(2) == 0 {
					fns = append(fns, f)
				}
			}
			if len(fns) == 0 {
				fns = aggFns
			}
			q.Set("fn", strings.Join(fns, ","))
		}
		var fields []string
		if rng.IntN(3) == 0 {
			fields = [][]string{{"temp"}, {"count", "ok"}, {"state", "temp"}}[rng.IntN(3)]
			q.Set("fields", strings.Join(fields, ","))
		}
		pageSize := 0
		if rng.IntN(2) == 0 {
			pageSize = 1 + rng.IntN(40)
			q.Set("limit", strconv.Itoa(pageSize))
		}
		name := fmt.Sprintf("%s %d %s %s", phase, i, dev, q.Encode())

		want := model.expect(buckets.DeviceID(dev), from, to, buckets.Ticks(iv/100), fields)
		var got []aggBucket
		path := "/v1/devices/" + dev + "/aggregates"
		for page := 0; ; page++ {
			require.Less(t, page, 10000, name)
			var res aggResponse
			code, body := env.getJSON(t, path, q, &res)
			require.Equal(t, http.StatusOK, code, "%s: %s", name, body)
			require.Equal(t, dev, res.Device, name)
			require.Equal(t, iv.String(), res.Interval, name)
			if pageSize > 0 {
				require.LessOrEqual(t, len(res.Buckets), pageSize, name)
			}
			for _, b := range res.Buckets {
				got = append(got, aggBucket{start: buckets.MustTicks(b.Start), values: b.Values})
			}
			if res.Next == "" {
				break
			}
			require.Len(t, res.Buckets, pageSize, "%s: a page with next is full", name)
			q = url.Values{"cursor": {res.Next}, "limit": {strconv.Itoa(pageSize)}}
			if rng.IntN(2) == 0 { // repeating the parameters unchanged is allowed
				q.Set("interval", ivText)
			}
		}
		compareBuckets(t, name, want, got, fns)
	}

	// Open blocks as written, sealed blocks after a reopen, late readings
	// merged over sealed blocks, and all of it sealed again.
	write(first)
	for i := range 30 {
		query("written", i)
	}
	env.reopen(t)
	for i := range 30 {
		query("sealed", i)
	}
	write(late)
	for i := range 30 {
		query("late", i)
	}
	env.reopen(t)
	for i := range 30 {
		query("late sealed", i)
	}
}

// aggBucket is one bucket as answered.
type aggBucket struct {
	start  buckets.Ticks
	values map[string]map[string]json.RawMessage
}

func compareBuckets(t *testing.T, name string, want []expBucket, got []aggBucket, fns []string) {
	t.Helper()
	starts := func() (w, g []string) {
		for _, b := range want {
			w = append(w, b.start.FormatTime())
		}
		for _, b := range got {
			g = append(g, b.start.FormatTime())
		}
		return w, g
	}
	w, g := starts()
	require.Equal(t, w, g, "%s: bucket starts", name)
	for i, wb := range want {
		gb := got[i]
		require.Len(t, gb.values, len(wb.values), "%s: bucket %s names", name, w[i])
		for vn, sm := range wb.values {
			gv, ok := gb.values[vn]
			require.True(t, ok, "%s: bucket %s lacks %s", name, w[i], vn)
			require.Len(t, gv, len(fns), "%s: bucket %s %s fns %v", name, w[i], vn, gv)
			for _, fn := range fns {
				text := string(gv[fn])
				require.NotEmpty(t, text, "%s: %s %s lacks %s", name, w[i], vn, fn)
				var exp float64
				switch fn {
				case "count":
					n, err := strconv.ParseInt(text, 10, 64)
					require.NoError(t, err, "%s: count %q is not an integer", name, text)
					assert.Equal(t, sm.Count, n, "%s: %s %s count", name, w[i], vn)
					continue
				case "sum":
					exp = sm.Sum
				case "min":
					exp = sm.Min
				case "max":
					exp = sm.Max
				case "avg":
					exp = sm.Avg()
				case "first":
					exp = sm.First
				case "last":
					exp = sm.Last
				}
				f, err := strconv.ParseFloat(text, 64)
				require.NoError(t, err, name)
				assert.InDelta(t, exp, f, 1e-9*math.Max(1, math.Abs(exp)), "%s: %s %s %s", name, w[i], vn, fn)
			}
		}
	}
}

// TestAggregatesParameters checks every parameter's validation (400
// naming it) and the limits at their boundaries.
func TestAggregatesParameters(t *testing.T) {
	inLane(t, lanes.general)
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	env := newDashEnv(t, now)
	// 10,001 readings one second apart: 10,001 one-second buckets.
	k0 := buckets.MustTicks(now.Add(-3 * time.Hour))
	rs := make([]buckets.Reading, 10001)
	for i := range rs {
		rs[i] = newReading("d1", k0+buckets.Ticks(i)*buckets.TicksPerSecond,
			buckets.Field{Name: "temp", Value: buckets.Float(float64(i))})
	}
	env.write(t, rs...)
	path := "/v1/devices/d1/aggregates"
	win := url.Values{"from": {k0.FormatTime()}, "to": {now.Format(time.RFC3339)}}
	with := func(kv ...string) url.Values {
		q := url.Values{}
		for k, v := range win {
			q[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			q.Set(kv[i], kv[i+1])
		}
		return q
	}

	t.Run("10000 buckets per page, then next", func(t *testing.T) {
		var res aggResponse
		code, body := env.getJSON(t, path, with("interval", "1s", "fn", "count,first"), &res)
		require.Equal(t, http.StatusOK, code, string(body))
		require.Len(t, res.Buckets, 10000)
		require.NotEmpty(t, res.Next)
		var res2 aggResponse
		code, body = env.getJSON(t, path, url.Values{"cursor": {res.Next}}, &res2)
		require.Equal(t, http.StatusOK, code, string(body))
		require.Len(t, res2.Buckets, 1)
		assert.Empty(t, res2.Next)
		assert.Equal(t, `10000`, string(res2.Buckets[0].Values["temp"]["first"]))
	})
	t.Run("limit 10000 accepted, one bucket wide interval", func(t *testing.T) {
		var res aggResponse
		code, body := env.getJSON(t, path, with("interval", "366d", "limit", "10000", "fn", "count"), &res)
		require.Equal(t, http.StatusOK, code, string(body))
		require.Len(t, res.Buckets, 1)
		assert.Equal(t, "10001", string(res.Buckets[0].Values["temp"]["count"]))
		assert.Equal(t, "8784h0m0s", res.Interval)
	})
	t.Run("default interval is one minute and default fns", func(t *testing.T) {
		var res aggResponse
		code, body := env.getJSON(t, path, win, &res)
		require.Equal(t, http.StatusOK, code, string(body))
		assert.Equal(t, "1m0s", res.Interval)
		require.NotEmpty(t, res.Buckets)
		assert.Len(t, res.Buckets[0].Values["temp"], 4)
	})
	t.Run("unknown device has no buckets", func(t *testing.T) {
		var res aggResponse
		code, body := env.getJSON(t, "/v1/devices/nobody/aggregates", win, &res)
		if code == http.StatusOK {
			assert.Empty(t, res.Buckets)
		} else {
			assert.Equal(t, http.StatusNotFound, code, string(body))
		}
	})

	var first aggResponse
	code, _ := env.getJSON(t, path, with("interval", "1s", "limit", "5"), &first)
	require.Equal(t, http.StatusOK, code)
	require.NotEmpty(t, first.Next)
	var other aggResponse
	code, _ = env.getJSON(t, "/v1/devices/d1/aggregates", with("interval", "1s", "limit", "1", "fields", "temp"), &other)
	require.Equal(t, http.StatusOK, code)

	for _, tc := range []struct {
		name  string
		path  string
		q     url.Values
		param string
	}{
		{"interval below 1s", path, with("interval", "999ms"), "interval"},
		{"interval not a duration", path, with("interval", "fortnight"), "interval"},
		{"interval days over 366", path, with("interval", "367d"), "interval"},
		{"interval over 366d", path, with("interval", "8785h"), "interval"},
		{"interval negative", path, with("interval", "-1h"), "interval"},
		{"interval finer than a tick", path, with("interval", "1.00000005s"), "interval"},
		{"fn unknown", path, with("fn", "count,median"), "fn"},
		{"fn empty item", path, with("fn", "count,"), "fn"},
		{"fields bad name", path, with("fields", "temp,9x"), "fields"},
		{"from not a time", path, with("from", "yesterday"), "from"},
		{"to not a time", path, with("to", "later"), "to"},
		{"from not before to", path, with("from", now.Format(time.RFC3339), "to", now.Format(time.RFC3339)), "from"},
		{"limit zero", path, with("limit", "0"), "limit"},
		{"limit over 10000", path, with("limit", "10001"), "limit"},
		{"device invalid", "/v1/devices/bad%20id/aggregates", win, "device"},
		{"cursor damaged", path, url.Values{"cursor": {damagedCursor(first.Next)}}, "cursor"},
		{"cursor of another query", path, url.Values{"cursor": {first.Next}, "interval": {"1m"}}, "cursor"},
		{"cursor of another device", "/v1/devices/d2/aggregates", url.Values{"cursor": {first.Next}}, "cursor"},
		{"cursor with other fields", path, url.Values{"cursor": {other.Next}, "fields": {"x"}}, "cursor"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			code, body := env.getJSON(t, tc.path, tc.q, nil)
			require.Equal(t, http.StatusBadRequest, code, string(body))
			require.NoError(t, json.Unmarshal(body, &e))
			assert.Equal(t, "invalid_argument", e.Error.Code)
			assert.True(t, strings.HasPrefix(e.Error.Message, tc.param+": "), e.Error.Message)
		})
	}
}

// damagedCursor changes one character in the middle of a cursor. A
// middle character carries six bits of the decoded cursor, so the
// change always reaches its bytes; the last characters may carry only
// padding bits, or already be what a fixed replacement writes.
func damagedCursor(c string) string {
	b := []byte(c)
	i := len(b) / 2
	if b[i] == 'A' {
		b[i] = 'B'
	} else {
		b[i] = 'A'
	}
	return string(b)
}
