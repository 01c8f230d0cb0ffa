package api

import (
	"encoding/base64"
	"encoding/json"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	cases := []string{
		"", "plain", `quote " and backslash \`, "ctl \x00\x01\x1f\x7f", "\n\r\t\b\f", "é ü 日本 🙂",
		"\u2028\u2029", "bad \xff\xfe utf8 \xc3", "<script>&</script>", strings.Repeat("x", 5000),
	}
	rnd := rand.New(rand.NewPCG(7, 8))
	for range 2000 {
		b := make([]byte, rnd.IntN(24))
		for i := range b {
			b[i] = byte(rnd.IntN(256))
		}
		cases = append(cases, string(b))
	}
	for _, s := range cases {
		out := appendString(nil, s)
		require.True(t, json.Valid(out), "%q -> %s", s, out)
		var mine, theirs string
		require.NoError(t, json.Unmarshal(out, &mine))
		ref, err := json.Marshal(s)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(ref, &theirs))
		require.Equal(t, theirs, mine, "%q", s)
	}
}

func TestAppendFloatMatchesEncodingJSON(t *testing.T) {
	cases := []float64{0, math.Copysign(0, -1), 1, -1, 21.5, 0.1, 1e-6, 9.99e-7, 1e-7, 1e20, 1e21, 123456789e13,
		math.MaxFloat64, math.SmallestNonzeroFloat64, -1e-300, 1 << 53, 3.3, 1.0 / 3}
	rnd := rand.New(rand.NewPCG(9, 10))
	for range 5000 {
		f := math.Float64frombits(rnd.Uint64())
		if !math.IsNaN(f) && !math.IsInf(f, 0) {
			cases = append(cases, f)
		}
	}
	for _, f := range cases {
		want, err := json.Marshal(f)
		require.NoError(t, err)
		assert.Equal(t, string(want), string(appendFloat(nil, f)), "%v", f)
	}
	assert.Equal(t, "null", string(appendFloat(nil, math.NaN())))
	assert.Equal(t, "null", string(appendFloat(nil, math.Inf(1))))
}

func TestAppendReadingMatchesBuckets(t *testing.T) {
	rnd := rand.New(rand.NewPCG(11, 12))
	for range 1000 {
		k := buckets.Ticks(rnd.Int64N(int64(buckets.MaxTicks)))
		r := buckets.Reading{Device: "dev-1", Ticks: k, Values: []buckets.Field{{Name: "v", Value: buckets.Int(1)}}}
		var got struct {
			TS           string `json:"ts"`
			PartitionKey string `json:"partitionKey"`
			RowKey       string `json:"rowKey"`
		}
		out := appendReading(nil, &r, nil)
		require.NoError(t, json.Unmarshal(out, &got), "%s", out)
		require.Equal(t, k.FormatTime(), got.TS)
		require.Equal(t, r.PartitionKey(), got.PartitionKey)
		require.Equal(t, r.RowKey(), got.RowKey)
	}
}

func TestAppendValuesProjection(t *testing.T) {
	fields := []buckets.Field{
		{Name: "a", Value: buckets.Int(1)}, {Name: "b", Value: buckets.Int(2)},
		{Name: "c", Value: buckets.Int(3)}, {Name: "d", Value: buckets.Int(4)},
	}
	tests := []struct {
		proj []string
		want string
	}{
		{nil, `{"a":1,"b":2,"c":3,"d":4}`},
		{[]string{}, `{}`},
		{[]string{"b", "d"}, `{"b":2,"d":4}`},
		{[]string{"0", "a", "bb", "z"}, `{"a":1}`},
		{[]string{"e"}, `{}`},
	}
	for _, tt := range tests {
		assert.Equal(t, tt.want, string(appendValues(nil, fields, tt.proj)), "%v", tt.proj)
	}
	unsorted := []buckets.Field{{Name: "z", Value: buckets.Bool(true)}, {Name: "a", Value: buckets.String("x")}}
	assert.Equal(t, `{"a":"x","z":true}`, string(appendValues(nil, sortedFields(unsorted), nil)))
	assert.Equal(t, "z", unsorted[0].Name, "the caller's slice is not reordered")
}

func TestRangeCursorRoundTrip(t *testing.T) {
	cc := newCursorCodec([]byte("k"))
	in := rangeCursor{Device: "dev-1", From: 10, To: 1000, Order: buckets.Asc, Fields: []string{"a", "b.c"}, Last: 500}
	s := cc.encodeRange(in)
	assert.NotContains(t, s, "=", "unpadded base64url")
	assert.NotContains(t, s, "+")
	assert.NotContains(t, s, "/")
	out, err := cc.decodeRange(s)
	require.NoError(t, err)
	assert.Equal(t, in, out)

	_, err = newCursorCodec([]byte("other")).decodeRange(s)
	assert.ErrorContains(t, err, "cursor: failed its integrity check")
	_, err = cc.decodeDevices(s)
	assert.ErrorContains(t, err, "cursor: belongs to another kind of query")

	// A correctly signed payload with impossible contents is refused.
	for _, bad := range []rangeCursor{
		{Device: "a.b", From: 1, To: 2, Last: 1},
		{Device: "d", From: 2, To: 2, Last: 2},
		{Device: "d", From: 1, To: 5, Last: 5},
		{Device: "d", From: 1, To: 5, Last: 2, Order: 7},
		{Device: "d", From: 1, To: 5, Last: 2, Fields: []string{"b", "a"}},
		{Device: "d", From: -1, To: 5, Last: 2},
	} {
		_, err := cc.decodeRange(cc.encodeRange(bad))
		assert.ErrorContains(t, err, "cursor: malformed", "%+v", bad)
	}
}

// TestDevicesCursorHidesItsPosition: a devices cursor may hold the
// position of a device the caller cannot see; nothing of it can be read
// out of the cursor, not even its length.
func TestDevicesCursorHidesItsPosition(t *testing.T) {
	cc := newCursorCodec([]byte("k"))
	short := cc.encodeDevices(devicesCursor{Prefix: "", Last: "c"})
	hidden := cc.encodeDevices(devicesCursor{Prefix: "", Last: "card-009799"})
	assert.Len(t, hidden, len(short), "the position's length does not show")
	raw, err := base64.RawURLEncoding.DecodeString(hidden)
	require.NoError(t, err)
	assert.NotContains(t, string(raw), "card", "the position is not readable")
	assert.Equal(t, hidden, cc.encodeDevices(devicesCursor{Last: "card-009799"}), "the same state seals the same")
	assert.NotEqual(t, hidden, cc.encodeDevices(devicesCursor{Last: "card-009798"}))
	got, err := cc.decodeDevices(hidden)
	require.NoError(t, err)
	assert.Equal(t, devicesCursor{Last: "card-009799"}, got)
	_, err = newCursorCodec([]byte("other")).decodeDevices(hidden)
	assert.ErrorContains(t, err, "cursor: failed its integrity check")
}

// FuzzDecodeCursor checks that no input makes the cursor decoders
// panic, and that whatever decodes re-encodes to the same cursor.
func FuzzDecodeCursor(f *testing.F) {
	cc := newCursorCodec(nil)
	f.Add(cc.encodeRange(rangeCursor{Device: "d", From: 1, To: 9, Fields: []string{"t"}, Last: 3}))
	f.Add(cc.encodeDevices(devicesCursor{Prefix: "p", Last: "p1"}))
	f.Add("AQI")
	f.Fuzz(func(t *testing.T, s string) {
		if c, err := cc.decodeRange(s); err == nil {
			assert.Equal(t, s, cc.encodeRange(c))
		}
		if c, err := cc.decodeDevices(s); err == nil {
			assert.Equal(t, s, cc.encodeDevices(c))
		}
	})
}

// sendList writes a reading list the way the handlers do
// (sendReadingList, which streams lists past one chunk) and returns the
// body.
func sendList(t testing.TB, rs []buckets.Reading, proj []string, next string) []byte {
	t.Helper()
	srv, err := New(Config{Reader: pageReader{}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	rec := httptest.NewRecorder()
	c := srv.echo.NewContext(httptest.NewRequest(http.MethodGet, "/", nil), rec)
	require.NoError(t, srv.sendReadingList(c, "dev-1", rs, proj, next))
	require.Equal(t, http.StatusOK, rec.Code)
	return rec.Body.Bytes()
}

// The hand-written appenders must write exactly what encoding/json
// writes for the response types, so the types are the one description
// of the responses and the appenders only a faster way to the same
// bytes.
func TestAppendersMatchEncodingJSON(t *testing.T) {
	rnd := rand.New(rand.NewPCG(13, 14))
	randString := func() string {
		b := make([]byte, rnd.IntN(12))
		for i := range b {
			b[i] = "ab<>&\"\\\x00\x1f\x7f\xff\xc3"[rnd.IntN(12)]
		}
		return string(b) + []string{"", "é", "\u2028", "🙂"}[rnd.IntN(4)]
	}
	randValue := func() buckets.Value {
		switch rnd.IntN(4) {
		case 0:
			for {
				f := math.Float64frombits(rnd.Uint64())
				if rnd.IntN(2) == 0 {
					f = float64(rnd.IntN(100000)) / 100
				}
				if !math.IsNaN(f) && !math.IsInf(f, 0) {
					return buckets.Float(f)
				}
			}
		case 1:
			return buckets.Int(int64(rnd.Uint64()))
		case 2:
			return buckets.Bool(rnd.IntN(2) == 0)
		}
		return buckets.String(randString())
	}
	names := []string{"a", "b.c", "temp", "t_2", "Z", "ok"}
	encode := func(v any) string {
		var b strings.Builder
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(v))
		return b.String()
	}
	for n := range 500 {
		size := rnd.IntN(4)
		if n%100 == 0 {
			size = 2000 // past one chunk: the list is streamed
		}
		rs := make([]buckets.Reading, size)
		for i := range rs {
			rs[i] = buckets.Reading{Device: "dev-1", Ticks: buckets.Ticks(rnd.Int64N(int64(buckets.MaxTicks)))}
			for _, n := range names {
				if rnd.IntN(2) == 0 {
					rs[i].Values = append(rs[i].Values, buckets.Field{Name: n, Value: randValue()})
				}
			}
			rnd.Shuffle(len(rs[i].Values), func(a, b int) { rs[i].Values[a], rs[i].Values[b] = rs[i].Values[b], rs[i].Values[a] })
		}
		var proj []string
		if rnd.IntN(2) == 0 {
			proj = []string{}
			for _, n := range names {
				if rnd.IntN(2) == 0 {
					proj = append(proj, n)
				}
			}
			slices.Sort(proj)
		}
		next := []string{"", "AQID"}[rnd.IntN(2)]
		require.Equal(t, encode(readingListOf("dev-1", rs, proj, next)), string(sendList(t, rs, proj, next)))
		for i := range rs {
			require.Equal(t, encode(readingOf(&rs[i], proj)), string(appendReading(nil, &rs[i], proj))+"\n")
		}
	}
}

// The aggregates appenders write what encoding/json writes for the
// Aggregates type, for every choice of functions.
func TestAggregatesAppendersMatchEncodingJSON(t *testing.T) {
	rnd := rand.New(rand.NewPCG(15, 16))
	base := buckets.MustTicks(time.Date(2026, 11, 22, 0, 0, 0, 0, time.UTC))
	for range 300 {
		bs := make([]buckets.AggregateBucket, rnd.IntN(4))
		for i := range bs {
			bs[i].Start = base + buckets.Ticks(i)*60*buckets.TicksPerSecond
			for _, name := range []string{"a", "b.c", "temp", "x_y"} {
				if rnd.IntN(2) == 0 {
					continue
				}
				var sm buckets.Summary
				for j := range 1 + rnd.IntN(5) {
					v := math.Float64frombits(rnd.Uint64() &^ (0x7ff << 52))
					if rnd.IntN(2) == 0 {
						v = float64(rnd.IntN(1000)) / 8
					}
					sm.Add(bs[i].Start+buckets.Ticks(j), v)
				}
				bs[i].Values = append(bs[i].Values, buckets.NamedSummary{Name: name, Summary: sm})
			}
		}
		fns := aggFn(1 + rnd.IntN(int(fnAll)))
		interval := buckets.Ticks(1+rnd.IntN(3600)) * buckets.TicksPerSecond
		next := []string{"", "AQID"}[rnd.IntN(2)]
		var want strings.Builder
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(aggregatesOf("dev-1", interval, fns, bs, next)))
		got := appendAggregates(nil, "dev-1", aggregateCursor{Interval: interval, Fns: fns}, bs, next)
		require.Equal(t, want.String(), string(got))
	}
}
