package api_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// contractTS is the api/README.md example: epoch ms 1795309323456, ticks
// 639309061234560000, row key 2516069914765439999.
const contractTS = "2026-11-22T01:02:03.456Z"

func TestReadingJSONContract(t *testing.T) {
	env := newTestEnv(t)
	k := mustTicks(t, contractTS)
	env.reader.add(buckets.Reading{Device: "dev-1", Ticks: k, Values: []buckets.Field{
		{Name: "big", Value: buckets.Float(1e21)},
		{Name: "count", Value: buckets.Int(42)},
		{Name: "huge", Value: buckets.Int(-9007199254740993)},
		{Name: "msg", Value: buckets.String("say \"hi\"\n\u2028<é>")},
		{Name: "ok", Value: buckets.Bool(true)},
		{Name: "tiny", Value: buckets.Float(1e-7)},
		{Name: "whole", Value: buckets.Float(21)},
		{Name: "temp", Value: buckets.Float(21.5)}, // out of order on purpose
	}})

	for _, path := range []string{
		"/v1/devices/dev-1/readings/latest",
		"/v1/devices/dev-1/readings" + q("from", "2026-11-22T00:00:00Z", "to", "2026-11-23T00:00:00Z"),
	} {
		t.Run(path, func(t *testing.T) {
			res := env.get(t, path)
			require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
			assert.Equal(t, "application/json", res.header.Get("Content-Type"))
			body := res.json(t)
			assert.Equal(t, []string{"device", "readings"}, keys(body))
			assert.Equal(t, "dev-1", body["device"])
			rs := body["readings"].([]any)
			require.Len(t, rs, 1)
			r := rs[0].(map[string]any)
			assert.Equal(t, []string{"partitionKey", "rowKey", "ts", "values"}, keys(r))
			assert.Equal(t, contractTS, r["ts"])
			assert.Equal(t, "dev-1/2026-11-22", r["partitionKey"])
			assert.Equal(t, "2516069914765439999", r["rowKey"])
			assert.Equal(t, map[string]any{
				"big": json.Number("1e+21"), "count": json.Number("42"), "huge": json.Number("-9007199254740993"),
				"msg": "say \"hi\"\n\u2028<é>", "ok": true, "temp": json.Number("21.5"),
				"tiny": json.Number("1e-7"), "whole": json.Number("21"),
			}, r["values"])
			// Keys come out sorted by name.
			s := string(res.body)
			assert.Less(t, strings.Index(s, `"ok"`), strings.Index(s, `"temp"`))
			assert.Less(t, strings.Index(s, `"temp"`), strings.Index(s, `"tiny"`))
		})
	}
}

func TestLatestLimit(t *testing.T) {
	tests := []struct {
		limit  string
		status int
		want   int
	}{
		{"", http.StatusOK, 10},
		{"1", http.StatusOK, 1},
		{"1000", http.StatusOK, 1000},
		{"0", http.StatusBadRequest, 0},
		{"1001", http.StatusBadRequest, 0},
		{"-1", http.StatusBadRequest, 0},
		{"ten", http.StatusBadRequest, 0},
		{"1e3", http.StatusBadRequest, 0},
	}
	for _, tt := range tests {
		t.Run("limit="+tt.limit, func(t *testing.T) {
			env := newTestEnv(t)
			res := env.get(t, "/v1/devices/dev-1/readings/latest?limit="+tt.limit)
			if tt.status != http.StatusOK {
				requireError(t, res, tt.status, "invalid_argument", "limit")
				assert.Empty(t, env.reader.latest, "the reader must not be asked")
				return
			}
			require.Equal(t, tt.status, res.status, "body: %s", res.body)
			assert.Equal(t, []int{tt.want}, env.reader.latest)
		})
	}
}

func TestLatestReturnsNewestFirstWithoutNext(t *testing.T) {
	env := newTestEnv(t)
	base := mustTicks(t, "2026-11-22T10:00:00Z")
	for i := range 5 {
		env.reader.add(reading(t, "dev-1", base+buckets.Ticks(i)*buckets.TicksPerSecond, float64(i)))
	}
	body := env.get(t, "/v1/devices/dev-1/readings/latest?limit=3").json(t)
	assert.NotContains(t, body, "next")
	var got []string
	for _, r := range body["readings"].([]any) {
		got = append(got, r.(map[string]any)["ts"].(string))
	}
	assert.Equal(t, []string{"2026-11-22T10:00:04Z", "2026-11-22T10:00:03Z", "2026-11-22T10:00:02Z"}, got)
}

func TestRepeatedAndUnknownParameters(t *testing.T) {
	env := newTestEnv(t)
	res := env.get(t, "/v1/devices/dev-1/readings/latest?limit=5&limit=5000&bogus=1&limit=x")
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	assert.Equal(t, []int{5}, env.reader.latest, "the first limit wins; unknown parameters are ignored")
}

func TestRangeParameters(t *testing.T) {
	day := "2026-11-22T00:00:00Z"
	next := "2026-11-23T00:00:00Z"
	tests := []struct {
		name, query string
		param       string // the parameter a 400 must name; "" for 200
	}{
		{"limit 10000 ok", q("limit", "10000"), ""},
		{"limit 1 ok", q("limit", "1"), ""},
		{"limit 10001", q("limit", "10001"), "limit"},
		{"limit 0", q("limit", "0"), "limit"},
		{"from unparsable", q("from", "abc"), "from"},
		{"to unparsable", q("to", "2026-13-01T00:00:00Z"), "to"},
		{"from equals to", q("from", day, "to", day), "from"},
		{"from after to", q("from", next, "to", day), "from"},
		{"from after default to", q("from", "2027-01-01T00:00:00Z"), "from"},
		{"order unknown", q("order", "newest"), "order"},
		{"order upper case", q("order", "DESC"), "order"},
		{"order asc", q("order", "asc"), ""},
		{"bad field", q("fields", "temp,1x"), "fields"},
		{"empty field", q("fields", "temp,,ok"), "fields"},
		{"epoch ms", q("from", "1795309323456", "to", "1795309323457"), ""},
		{"empty values are defaults", "?from=&to=&order=&limit=&cursor=&fields=", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := newTestEnv(t)
			res := env.get(t, "/v1/devices/dev-1/readings"+tt.query)
			if tt.param != "" {
				requireError(t, res, http.StatusBadRequest, "invalid_argument", tt.param)
				assert.Empty(t, env.reader.rangeCalls())
				return
			}
			require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
			require.Len(t, env.reader.rangeCalls(), 1)
		})
	}
}

func TestRangeUnparsableFromMessage(t *testing.T) {
	env := newTestEnv(t)
	msg := requireError(t, env.get(t, "/v1/devices/dev-1/readings?from=abc"), http.StatusBadRequest, "invalid_argument", "from")
	assert.Equal(t, `from: cannot parse "abc" as RFC 3339 or epoch milliseconds`, msg)
}

func TestRangeResolvesDefaultsAndTimes(t *testing.T) {
	env := newTestEnv(t, func(c *api.Config) { c.MaxFutureSkew = 2 * time.Minute })
	tests := []struct {
		name, query string
		from, to    string
		order       buckets.Order
		limit       int
	}{
		{"defaults", "", "2026-11-21T12:02:00Z", "2026-11-22T12:02:00Z", buckets.Desc, 1000},
		{"only to", q("to", "2026-11-20T06:00:00Z"), "2026-11-19T06:00:00Z", "2026-11-20T06:00:00Z", buckets.Desc, 1000},
		{"only from", q("from", "2026-11-22T11:00:00Z"), "2026-11-22T11:00:00Z", "2026-11-22T12:02:00Z", buckets.Desc, 1000},
		{"epoch ms and asc", q("from", "1795309323456", "to", "1795309324456", "order", "asc", "limit", "7"),
			contractTS, "2026-11-22T01:02:04.456Z", buckets.Asc, 7},
		{"offset", q("from", "2026-11-22T02:00:00+01:00", "to", "2026-11-22T02:00:00-01:00"),
			"2026-11-22T01:00:00Z", "2026-11-22T03:00:00Z", buckets.Desc, 1000},
		// An unencoded '+' arrives as a space; it is read back as '+'.
		{"plus sent raw", "?from=2026-11-22T02:00:00+01:00", "2026-11-22T01:00:00Z", "2026-11-22T12:02:00Z", buckets.Desc, 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(env.reader.rangeCalls())
			res := env.get(t, "/v1/devices/dev-1/readings"+tt.query)
			require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
			calls := env.reader.rangeCalls()
			require.Len(t, calls, before+1)
			got := calls[before]
			assert.Equal(t, buckets.DeviceID("dev-1"), got.Device)
			assert.Equal(t, tt.from, got.From.FormatTime())
			assert.Equal(t, tt.to, got.To.FormatTime())
			assert.Equal(t, tt.order, got.Order)
			assert.Equal(t, tt.limit, got.Limit)
			assert.Nil(t, got.After)
		})
	}
}

func TestPointQuery(t *testing.T) {
	env := newTestEnv(t)
	k := mustTicks(t, contractTS)
	env.reader.add(buckets.Reading{Device: "dev-1", Ticks: k, Values: []buckets.Field{
		{Name: "ok", Value: buckets.Bool(false)}, {Name: "temp", Value: buckets.Float(21.5)},
	}})
	for _, ts := range []string{contractTS, "1795309323456", "2026-11-22T02:02:03.456+01:00", "2026-11-22T01%3A02%3A03.456Z", "2026-11-22t01:02:03.456z"} {
		t.Run("found "+ts, func(t *testing.T) {
			res := env.get(t, "/v1/devices/dev-1/readings/"+ts)
			require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
			body := res.json(t)
			assert.Equal(t, []string{"partitionKey", "rowKey", "ts", "values"}, keys(body))
			assert.Equal(t, contractTS, body["ts"])
			assert.Equal(t, "2516069914765439999", body["rowKey"])
			assert.Equal(t, "dev-1/2026-11-22", body["partitionKey"])
			assert.Equal(t, map[string]any{"ok": false, "temp": json.Number("21.5")}, body["values"])
		})
	}
	t.Run("absent", func(t *testing.T) {
		msg := requireError(t, env.get(t, "/v1/devices/dev-1/readings/2026-11-22T01:02:03.457Z"), http.StatusNotFound, "not_found", "ts")
		assert.Contains(t, msg, "2026-11-22T01:02:03.457Z")
	})
	t.Run("other device", func(t *testing.T) {
		requireError(t, env.get(t, "/v1/devices/dev-2/readings/"+contractTS), http.StatusNotFound, "not_found", "ts")
	})
	t.Run("bad ts", func(t *testing.T) {
		before := len(env.reader.gets)
		requireError(t, env.get(t, "/v1/devices/dev-1/readings/yesterday"), http.StatusBadRequest, "invalid_argument", "ts")
		assert.Len(t, env.reader.gets, before)
	})
	assert.Equal(t, k, env.reader.gets[0], "the reader is asked for exactly the parsed ticks")
}

func TestFieldsProjection(t *testing.T) {
	env := newTestEnv(t)
	base := mustTicks(t, "2026-11-22T10:00:00Z")
	env.reader.add(
		buckets.Reading{Device: "dev-1", Ticks: base, Values: []buckets.Field{
			{Name: "hum", Value: buckets.Int(40)}, {Name: "ok", Value: buckets.Bool(true)}, {Name: "temp", Value: buckets.Float(20.5)},
		}},
		buckets.Reading{Device: "dev-1", Ticks: base + 1, Values: []buckets.Field{{Name: "volt", Value: buckets.Float(3.3)}}},
	)
	valuesOf := func(t *testing.T, res response) []any {
		t.Helper()
		require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
		var out []any
		for _, r := range res.json(t)["readings"].([]any) {
			out = append(out, r.(map[string]any)["values"])
		}
		return out
	}
	t.Run("latest", func(t *testing.T) {
		got := valuesOf(t, env.get(t, "/v1/devices/dev-1/readings/latest?fields=temp,missing,ok"))
		assert.Equal(t, []any{
			map[string]any{}, // none of the fields: still returned, values empty
			map[string]any{"ok": true, "temp": json.Number("20.5")},
		}, got)
	})
	t.Run("repeated", func(t *testing.T) {
		got := valuesOf(t, env.get(t, "/v1/devices/dev-1/readings/latest?fields=temp&fields=&fields=missing,ok&fields=temp"))
		assert.Equal(t, []any{
			map[string]any{},
			map[string]any{"ok": true, "temp": json.Number("20.5")},
		}, got, "fields=a&fields=b is fields=a,b")
	})
	t.Run("range", func(t *testing.T) {
		got := valuesOf(t, env.get(t, "/v1/devices/dev-1/readings?fields=volt&order=asc"))
		assert.Equal(t, []any{map[string]any{}, map[string]any{"volt": json.Number("3.3")}}, got)
	})
	t.Run("point", func(t *testing.T) {
		res := env.get(t, "/v1/devices/dev-1/readings/2026-11-22T10:00:00Z?fields=hum")
		require.Equal(t, http.StatusOK, res.status)
		assert.Equal(t, map[string]any{"hum": json.Number("40")}, res.json(t)["values"])
	})
	t.Run("invalid name", func(t *testing.T) {
		msg := requireError(t, env.get(t, "/v1/devices/dev-1/readings/latest?fields=temp,a%20b"), http.StatusBadRequest, "invalid_argument", "fields")
		assert.Contains(t, msg, `"a b"`)
	})
	t.Run("too many names", func(t *testing.T) {
		names := make([]string, buckets.MaxValues+1)
		for i := range names {
			names[i] = "v" + strconv.Itoa(i)
		}
		requireError(t, env.get(t, "/v1/devices/dev-1/readings/latest?fields="+strings.Join(names, ",")), http.StatusBadRequest, "invalid_argument", "fields")
		res := env.get(t, "/v1/devices/dev-1/readings/latest?fields="+strings.Join(names[:buckets.MaxValues], ","))
		assert.Equal(t, http.StatusOK, res.status, "exactly %d names are accepted", buckets.MaxValues)
	})
}
