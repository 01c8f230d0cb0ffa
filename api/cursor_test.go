package api_test

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// page fetches one range page and returns the tss and the next cursor.
func page(t *testing.T, env *testEnv, dev, query string) (tss []string, next string) {
	t.Helper()
	res := env.get(t, "/v1/devices/"+dev+"/readings"+query)
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	body := res.json(t)
	for _, r := range body["readings"].([]any) {
		tss = append(tss, r.(map[string]any)["ts"].(string))
	}
	if n, ok := body["next"]; ok {
		next = n.(string)
		require.NotEmpty(t, next, "next is absent, never empty")
	}
	return tss, next
}

func TestRangeCursorPagingReturnsEachReadingOnce(t *testing.T) {
	for _, order := range []string{"desc", "asc"} {
		t.Run(order, func(t *testing.T) {
			env := newTestEnv(t)
			// 25 readings in the default window (the last 24 h), one a minute.
			start := testNow.Add(-2 * time.Hour)
			want := map[string]bool{}
			for i := range 25 {
				k := buckets.MustTicks(start.Add(time.Duration(i) * time.Minute))
				env.reader.add(reading(t, "dev-1", k, float64(i)))
				want[k.FormatTime()] = true
			}
			var got []string
			tss, next := page(t, env, "dev-1", q("order", order, "limit", "10"))
			got = append(got, tss...)
			limits := []string{"7", "10000"}
			for i := 0; next != ""; i++ {
				require.Less(t, i, len(limits), "too many pages")
				// Time passes and new readings arrive past the end of
				// the pinned window: the window must not slide to them.
				env.clock.Add(time.Hour)
				env.reader.add(reading(t, "dev-1", buckets.MustTicks(env.clock.Now()), -1))
				// Only the cursor (and a new limit): the cursor carries the query.
				tss, next = page(t, env, "dev-1", q("cursor", next, "limit", limits[i]))
				got = append(got, tss...)
			}
			seen := map[string]int{}
			for _, ts := range got {
				seen[ts]++
			}
			for ts, n := range seen {
				assert.Equal(t, 1, n, "%s returned %d times", ts, n)
			}
			for ts := range want {
				assert.Contains(t, seen, ts, "%s was never returned", ts)
			}
			assert.Len(t, got, 25, "readings past the pinned window must not appear")

			calls := env.reader.rangeCalls()
			require.Len(t, calls, 3)
			for i, c := range calls {
				assert.Equal(t, calls[0].From, c.From, "page %d: from is pinned", i)
				assert.Equal(t, calls[0].To, c.To, "page %d: to is pinned", i)
				assert.Equal(t, calls[0].Order, c.Order)
			}
			assert.Equal(t, "2026-11-22T12:05:00Z", calls[0].To.FormatTime(), "to = now + default skew")
			assert.Nil(t, calls[0].After)
			require.NotNil(t, calls[1].After)
			assert.Equal(t, got[9], calls[1].After.FormatTime(), "page 2 resumes behind the last reading of page 1")
			require.NotNil(t, calls[2].After)
			assert.Equal(t, got[16], calls[2].After.FormatTime())
			assert.Equal(t, []int{10, 7, 10000}, []int{calls[0].Limit, calls[1].Limit, calls[2].Limit})
		})
	}
}

func TestRangeCursorAcceptsTheSameExplicitQuery(t *testing.T) {
	env := newTestEnv(t)
	for i := range 3 {
		env.reader.add(reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:00Z")+buckets.Ticks(i), 1))
	}
	query := []string{"from", "2026-11-22T00:00:00Z", "to", "2026-11-23T00:00:00Z", "order", "asc", "fields", "temp,hum", "limit", "2"}
	_, next := page(t, env, "dev-1", q(query...))
	require.NotEmpty(t, next)
	// The same instants written differently, fields reordered.
	tss, next2 := page(t, env, "dev-1", q("from", "1795305600000", "to", "2026-11-23T01:00:00+01:00",
		"order", "asc", "fields", "hum,temp", "cursor", next))
	assert.Len(t, tss, 1)
	assert.Empty(t, next2)
}

func TestRangeCursorRejected(t *testing.T) {
	env := newTestEnv(t)
	for i := range 5 {
		env.reader.add(reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:00Z")+buckets.Ticks(i), 1))
	}
	query := []string{"from", "2026-11-22T00:00:00Z", "to", "2026-11-23T00:00:00Z", "fields", "temp", "limit", "2"}
	_, cursor := page(t, env, "dev-1", q(query...))
	require.NotEmpty(t, cursor)
	raw, err := base64.RawURLEncoding.DecodeString(cursor)
	require.NoError(t, err)
	flip := func(i int) string {
		b := append([]byte(nil), raw...)
		b[i] ^= 0x01
		return base64.RawURLEncoding.EncodeToString(b)
	}

	otherKey := newTestEnv(t, func(c *api.Config) { c.CursorKey = []byte("another key") })
	for i := range 5 {
		otherKey.reader.add(reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:00Z")+buckets.Ticks(i), 1))
	}
	_, foreign := page(t, otherKey, "dev-1", q(query...))

	devCursor := func() string {
		env.reader.devices = []buckets.DeviceInfo{{Device: "a"}, {Device: "b"}}
		body := env.get(t, "/v1/devices?limit=1").json(t)
		return body["next"].(string)
	}()

	tests := []struct {
		name, dev, query string
	}{
		{"not base64", "dev-1", q("cursor", "!!!not base64!!!")},
		{"too short", "dev-1", q("cursor", "AQI")},
		{"truncated", "dev-1", q("cursor", cursor[:len(cursor)-4])},
		{"forged payload", "dev-1", q("cursor", flip(5))},
		{"forged mac", "dev-1", q("cursor", flip(len(raw)-1))},
		{"signed with another key", "dev-1", q("cursor", foreign)},
		{"devices cursor", "dev-1", q("cursor", devCursor)},
		{"other device", "dev-2", q("cursor", cursor)},
		{"other from", "dev-1", q("cursor", cursor, "from", "2026-11-22T00:00:01Z")},
		{"other to", "dev-1", q("cursor", cursor, "to", "2026-11-24T00:00:00Z")},
		{"other order", "dev-1", q("cursor", cursor, "order", "asc")},
		{"other fields", "dev-1", q("cursor", cursor, "fields", "hum")},
		{"huge", "dev-1", q("cursor", string(make([]byte, 40000)))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := len(env.reader.rangeCalls())
			requireError(t, env.get(t, "/v1/devices/"+tt.dev+"/readings"+tt.query), http.StatusBadRequest, "invalid_argument", "cursor")
			assert.Len(t, env.reader.rangeCalls(), before, "the reader must not be asked")
		})
	}
	t.Run("the original still works", func(t *testing.T) {
		tss, next := page(t, env, "dev-1", "?cursor="+url.QueryEscape(cursor))
		assert.Len(t, tss, 3, "the 3 readings behind the first page (limit is not part of the cursor)")
		assert.Empty(t, next)
	})
}

func TestRangeCursorSurvivesRestart(t *testing.T) {
	key := func(c *api.Config) { c.CursorKey = []byte("shared across restarts") }
	first := newTestEnv(t, key)
	second := newTestEnv(t, key)
	for _, env := range []*testEnv{first, second} {
		for i := range 4 {
			env.reader.add(reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:00Z")+buckets.Ticks(i), 1))
		}
	}
	_, next := page(t, first, "dev-1", q("limit", "3"))
	require.NotEmpty(t, next)
	tss, _ := page(t, second, "dev-1", q("cursor", next))
	assert.Equal(t, []string{"2026-11-22T10:00:00Z"}, tss)
}

func TestCursorOfAnotherKeyIsRejected(t *testing.T) {
	for name, keys := range map[string][2][]byte{
		"two installations":         {[]byte("installation one"), []byte("installation two")},
		"no key makes a random one": {nil, nil},
	} {
		t.Run(name, func(t *testing.T) {
			first := newTestEnv(t, func(c *api.Config) { c.CursorKey = keys[0] })
			second := newTestEnv(t, func(c *api.Config) { c.CursorKey = keys[1] })
			for _, env := range []*testEnv{first, second} {
				env.reader.add(reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:00Z"), 1),
					reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:01Z"), 1))
			}
			_, next := page(t, first, "dev-1", q("limit", "1"))
			require.NotEmpty(t, next)
			msg := requireError(t, second.get(t, "/v1/devices/dev-1/readings"+q("cursor", next)),
				http.StatusBadRequest, "invalid_argument", "cursor")
			assert.Contains(t, msg, "signed with another key")
			tss, _ := page(t, first, "dev-1", q("cursor", next))
			assert.Equal(t, []string{"2026-11-22T10:00:00Z"}, tss, "the signing installation still accepts it")
		})
	}
}
