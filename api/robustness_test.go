package api_test

import (
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// robustnessTargets are the routes garbage is thrown at.
var robustnessTargets = []struct{ method, path string }{
	{http.MethodGet, "/v1/devices/dev-1/readings/latest"},
	{http.MethodGet, "/v1/devices/dev-1/readings"},
	{http.MethodGet, "/v1/devices/dev-1/readings/" + contractTS},
	{http.MethodGet, "/v1/devices"},
	{http.MethodGet, "/v1/tables"},
	{http.MethodDelete, "/v1/tables/2026-11-22"},
	{http.MethodPost, "/v1/retention/run"},
	{http.MethodGet, "/readyz"},
}

// paramNames are the known parameters plus a few unknown ones.
var paramNames = []string{"from", "to", "order", "limit", "cursor", "fields", "prefix", "dry_run", "ts", "x", ""}

// garbageValues mixes plausible and hostile values.
var garbageValues = []string{
	"", "0", "-1", "1", "10000", "10001", "99999999999999999999", "1e3", "asc", "desc", "DESC",
	"2026-11-22T00:00:00Z", "2026-11-22T00:00:00+01:00", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59.9999999Z",
	"-62135596800001", "253402300800000", "abc", "%00", "%ff%fe", "a,b,,c", "temp,", ",", "../../etc",
	"\u2028", "\x7f", "AQ", "AQI", "AQJy", strings.Repeat("A", 100), "true", "maybe", "9999-99-99",
}

// runGarbage sends one request with query built from rnd and checks the
// server never answers 5xx and always answers JSON.
func runGarbage(t *testing.T, env *testEnv, method, path, query string) {
	t.Helper()
	req := httptest.NewRequest(method, "/", nil)
	req.URL.Path = path
	req.URL.RawQuery = query
	req.RemoteAddr = "127.0.0.1:1234"
	rec := httptest.NewRecorder()
	env.srv.Handler().ServeHTTP(rec, req)
	assert.Less(t, rec.Code, 500, "%s %s?%s -> %d %s", method, path, query, rec.Code, rec.Body.String())
	assert.Equal(t, "application/json", rec.Header().Get("Content-Type"), "%s %s?%s", method, path, query)
}

func TestGarbageQueriesNeverFail(t *testing.T) {
	env := newTestEnv(t)
	env.admin.tables[buckets.DayOfTime(testNow)] = buckets.TableDrop{Reason: "manual"}
	env.reader.add(reading(t, "dev-1", mustTicks(t, contractTS), 1))
	rnd := rand.New(rand.NewPCG(1, 2))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for range n {
		target := robustnessTargets[rnd.IntN(len(robustnessTargets))]
		var b strings.Builder
		for j := range rnd.IntN(6) {
			if j > 0 {
				b.WriteByte("&;"[rnd.IntN(2)])
			}
			b.WriteString(paramNames[rnd.IntN(len(paramNames))])
			if rnd.IntN(8) > 0 {
				b.WriteByte('=')
			}
			v := garbageValues[rnd.IntN(len(garbageValues))]
			if rnd.IntN(3) == 0 {
				v = randomBytes(rnd)
			}
			b.WriteString(v)
		}
		runGarbage(t, env, target.method, target.path, b.String())
	}
}

func randomBytes(rnd *rand.Rand) string {
	b := make([]byte, rnd.IntN(40))
	for i := range b {
		b[i] = byte(rnd.IntN(256))
	}
	return string(b)
}

// FuzzQuery throws arbitrary query strings at every route (`go test
// -fuzz FuzzQuery ./api/`); without -fuzz it runs the seeds.
func FuzzQuery(f *testing.F) {
	for _, s := range []string{"", "limit=0", "from=abc&to=1", "cursor=AQJy", "fields=a,,b", "order=x", "prefix=..", "dry_run=2"} {
		f.Add(uint8(0), s)
	}
	env := newTestEnv(f)
	f.Fuzz(func(t *testing.T, route uint8, query string) {
		target := robustnessTargets[int(route)%len(robustnessTargets)]
		runGarbage(t, env, target.method, target.path, query)
	})
}

func TestCursorGarbageNeverFails(t *testing.T) {
	env := newTestEnv(t)
	env.reader.add(reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:00Z"), 1),
		reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:01Z"), 1))
	_, next := page(t, env, "dev-1", "?limit=1")
	require.NotEmpty(t, next)
	rnd := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		b := []byte(next)
		for range 1 + rnd.IntN(3) {
			b[rnd.IntN(len(b))] = "ABCxyz019-_=+/%"[rnd.IntN(15)]
		}
		if string(b) == next {
			continue
		}
		res := env.get(t, "/v1/devices/dev-1/readings?cursor="+url.QueryEscape(string(b)))
		requireError(t, res, http.StatusBadRequest, "invalid_argument", "cursor")
	}
}
