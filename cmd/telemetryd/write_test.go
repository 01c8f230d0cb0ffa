package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/partition"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// post sends body to path with the given headers.
func (s *testService) post(t *testing.T, path string, body []byte, hdr map[string]string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, s.base+path, bytes.NewReader(body))
	require.NoError(t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// influxBody decodes an InfluxDB error body.
func influxBody(t *testing.T, body string) (code, msg string) {
	t.Helper()
	var e struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	return e.Code, e.Message
}

// point reads the reading of device at ts (404 allowed).
func (s *testService) point(t *testing.T, device string, ts time.Time) (int, map[string]any) {
	t.Helper()
	var r apiReading
	code, _ := s.get(t, "/v1/devices/"+device+"/readings/"+ts.UTC().Format(time.RFC3339Nano), &r)
	return code, r.Values
}

// deadLetters subscribes to the dead letter subjects.
func deadLetters(t *testing.T, s *testService) *nats.Subscription {
	t.Helper()
	sub, err := s.nc.SubscribeSync("rejected.telemetry.>")
	require.NoError(t, err)
	// The server must know the subscription before the service
	// publishes on its own connection.
	require.NoError(t, s.nc.Flush())
	return sub
}

func gz(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	_, err := zw.Write(b)
	require.NoError(t, err)
	require.NoError(t, zw.Close())
	return buf.Bytes()
}

func TestLineProtocolMapping(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute)
	ns := at.UnixNano()
	body := fmt.Sprintf(`# a comment, then a blank line

climate,device=lp-1,room=kitchen,host=gw-7 temp=21.5,hum=40i,count=7u,ok=true,note="say \"hi\"\\" %d
climate,host=lp-2 temp=1,off=F,big=-9223372036854775808i %d
meas,device=lp-3,spot=a\=b\ c\,d f=2.5e3 %d
my\ meas,device=lp-3 f\ x=1 %d
`, ns, ns, ns, ns)
	code, resp := s.post(t, "/api/v2/write?bucket=b&org=o", []byte(body), nil)
	require.Equal(t, http.StatusBadRequest, code, resp)
	_, msg := influxBody(t, resp)
	assert.Equal(t, `partial write: 1 of 4 lines rejected; line 6: values.my meas_f x: name has ' ' at byte 2; only A-Z a-z 0-9 _ . - are allowed (invalid_value_name)`, msg,
		"names are value names: an escaped space makes an invalid one")

	waitStored(t, s, "lp-1", 1)
	_, v := s.point(t, "lp-1", at)
	assert.Equal(t, map[string]any{
		"climate_temp": 21.5, "climate_hum": float64(40), "climate_count": float64(7), "climate_ok": true,
		"climate_note": `say "hi"\`,
	}, v, "fields become <measurement>_<field>")
	waitAttributes(t, s, "lp-1", map[string]string{"room": "kitchen", "host": "gw-7"})

	waitStored(t, s, "lp-2", 1)
	_, v = s.point(t, "lp-2", at)
	assert.Equal(t, map[string]any{"climate_temp": 1.0, "climate_off": false, "climate_big": -9223372036854775808.0}, v,
		"host names the device when device is absent")

	// Value types survive exactly: the float 1 stays a float, the
	// integer fields stay integers.
	var l apiList
	s.get(t, "/v1/devices/lp-2/readings/latest", &l)
	raw, _ := json.Marshal(l)
	assert.Contains(t, string(raw), `"climate_temp":1`)

	waitStored(t, s, "lp-3", 1)
	_, v = s.point(t, "lp-3", at)
	assert.Equal(t, map[string]any{"meas_f": 2500.0}, v)
	waitAttributes(t, s, "lp-3", map[string]string{"spot": "a=b c,d"}) // escaped tag values arrive unescaped
}

func TestLineProtocolPrecisions(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	// A time that every precision can express exactly.
	at := testEpoch.Add(-2 * time.Hour)
	cases := []struct {
		path, precision string
		unit            time.Duration
	}{
		{"/api/v2/write", "", time.Nanosecond},
		{"/api/v2/write", "ns", time.Nanosecond},
		{"/api/v2/write", "us", time.Microsecond},
		{"/api/v2/write", "ms", time.Millisecond},
		{"/api/v2/write", "s", time.Second},
		{"/write", "", time.Nanosecond},
		{"/write", "n", time.Nanosecond},
		{"/write", "ns", time.Nanosecond},
		{"/write", "u", time.Microsecond},
		{"/write", "us", time.Microsecond},
		{"/write", "ms", time.Millisecond},
		{"/write", "s", time.Second},
		{"/write", "m", time.Minute},
		{"/write", "h", time.Hour},
	}
	for i, tc := range cases {
		device := fmt.Sprintf("prec-%d", i)
		line := fmt.Sprintf("m,device=%s v=%di %d\n", device, i, at.UnixNano()/int64(tc.unit))
		code, resp := s.post(t, tc.path+"?db=x&precision="+tc.precision, []byte(line), nil)
		require.Equal(t, http.StatusNoContent, code, "%s precision=%q: %s", tc.path, tc.precision, resp)
		waitStored(t, s, device, 1)
		code, v := s.point(t, device, at)
		require.Equal(t, http.StatusOK, code, "%s precision=%q: not stored at %s", tc.path, tc.precision, at)
		assert.Equal(t, float64(i), v["m_v"])
	}
	// The boundary: m and h are v1 only; unknown ones are refused.
	for _, bad := range []string{"/api/v2/write?precision=m", "/api/v2/write?precision=h", "/api/v2/write?precision=n",
		"/write?precision=x", "/write?precision=sec"} {
		code, resp := s.post(t, bad, []byte("m,device=p v=1\n"), nil)
		assert.Equal(t, http.StatusBadRequest, code, bad)
		c, msg := influxBody(t, resp)
		assert.Equal(t, "invalid", c)
		assert.Contains(t, msg, "precision")
	}
}

func TestLineProtocolWithoutTimestampTakesArrivalTime(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	before := s.now()
	code, resp := s.post(t, "/write", []byte("m,device=nots a=1\nm,device=nots b=2\n"), nil)
	require.Equal(t, http.StatusNoContent, code, resp)
	waitStored(t, s, "nots", 1)
	var l apiList
	s.get(t, "/v1/devices/nots/readings/latest", &l)
	require.Len(t, l.Readings, 1, "lines without a timestamp share the request's time and merge")
	assert.Equal(t, map[string]any{"m_a": 1.0, "m_b": 2.0}, l.Readings[0].Values)
	ts, err := time.Parse(time.RFC3339Nano, l.Readings[0].TS)
	require.NoError(t, err)
	assert.WithinDuration(t, before, ts, 5*time.Second)
}

func TestLineProtocolGzip(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute)
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, "m,device=gz v=%di %d\n", i, at.Add(time.Duration(i)*time.Millisecond).UnixNano())
	}
	code, resp := s.post(t, "/api/v2/write", gz(t, []byte(b.String())), map[string]string{"Content-Encoding": "gzip"})
	require.Equal(t, http.StatusNoContent, code, resp)
	waitStored(t, s, "gz", 100)

	code, resp = s.post(t, "/api/v2/write", []byte("not gzip"), map[string]string{"Content-Encoding": "gzip"})
	assert.Equal(t, http.StatusBadRequest, code, resp)
	code, resp = s.post(t, "/api/v2/write", []byte("m,device=gz v=1"), map[string]string{"Content-Encoding": "br"})
	assert.Equal(t, http.StatusUnsupportedMediaType, code, resp)
}

func TestLineProtocolPartialWrite(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	sub := deadLetters(t, s)
	at := testEpoch.Add(-time.Minute).UnixNano()
	lines := []string{
		fmt.Sprintf("m,device=pw v=1 %d", at),
		fmt.Sprintf("m,device=pw v=2 %d", at+1000),
		fmt.Sprintf("m,device=pw v=3x %d", at+2000), // bad field
		fmt.Sprintf("m,device=pw v=4 %d", at+3000),
		fmt.Sprintf("m,room=k v=5 %d", at+4000), // no device tag
	}
	code, resp := s.post(t, "/api/v2/write", []byte(strings.Join(lines, "\n")), nil)
	require.Equal(t, http.StatusBadRequest, code, resp)
	c, msg := influxBody(t, resp)
	assert.Equal(t, "invalid", c)
	assert.True(t, strings.HasPrefix(msg, "partial write: 2 of 5 lines rejected; line 3: "), msg)
	assert.Contains(t, msg, "line 5: ")
	assert.Contains(t, msg, "invalid_device")
	waitStored(t, s, "pw", 3)

	m1, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "rejected.telemetry.pw", m1.Subject)
	assert.Equal(t, lines[2], string(m1.Data))
	assert.Equal(t, "invalid_payload", m1.Header.Get(topology.HeaderErrorCode))
	assert.Contains(t, m1.Header.Get(topology.HeaderError), "line 3")
	m2, err := sub.NextMsg(5 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "rejected.telemetry._invalid", m2.Subject)
	assert.Equal(t, lines[4], string(m2.Data))
	assert.Equal(t, "invalid_device", m2.Header.Get(topology.HeaderErrorCode))
}

func TestLineProtocolConflicts(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute)
	ns := at.UnixNano()
	body := fmt.Sprintf("m,device=cf a=1 %[1]d\nm,device=cf b=2 %[1]d\nm,device=cf a=1 %[1]d\nm,device=cf a=9 %[1]d\nn,device=cf a=3 %[1]d\n", ns)
	code, resp := s.post(t, "/write", []byte(body), nil)
	require.Equal(t, http.StatusBadRequest, code, resp)
	_, msg := influxBody(t, resp)
	assert.Contains(t, msg, "partial write: 1 of 5 lines rejected; line 4: ")
	assert.Contains(t, resp, `"error":"partial write: 1 of 5`, "1.x clients read the message from \"error\"")
	assert.Contains(t, msg, "conflicting_lines")
	assert.Contains(t, msg, "line 1")
	waitStored(t, s, "cf", 1)
	_, v := s.point(t, "cf", at)
	assert.Equal(t, map[string]any{"m_a": 1.0, "m_b": 2.0, "n_a": 3.0}, v,
		"lines of one device and time merge; the same value twice is no conflict")
}

func TestLineProtocolFieldTypesAtTheirLimits(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute).UnixNano()
	long := strings.Repeat("x", 4096)
	lines := []string{
		fmt.Sprintf(`m,device=ft u=9223372036854775807u,i=-1i,f=-0.5,b=TRUE,s="%s" %d`, long, at),
		fmt.Sprintf(`m,device=ft u=9223372036854775808u %d`, at+100),                // unsigned past int64
		fmt.Sprintf(`m,device=ft s="%sx" %d`, long, at+200),                         // string past 4 KiB
		fmt.Sprintf(`m,device=ft i=9223372036854775808i %d`, at+300),                // integer out of range
		fmt.Sprintf(`m,device=ft f=1 %d`, testEpoch.Add(10*time.Minute).UnixNano()), // past the future skew
		fmt.Sprintf(`m,device=ft f=1 %d`, testEpoch.Add(-721*time.Hour).UnixNano()), // older than retention
	}
	code, resp := s.post(t, "/api/v2/write", []byte(strings.Join(lines, "\n")), nil)
	require.Equal(t, http.StatusBadRequest, code, resp)
	_, msg := influxBody(t, resp)
	assert.Contains(t, msg, "partial write: 5 of 6 lines rejected; line 2: ")
	assert.Contains(t, msg, "invalid_value")
	assert.Contains(t, msg, "line 3: ")
	assert.Contains(t, msg, "string_too_long")
	waitStored(t, s, "ft", 1)
	_, v := s.point(t, "ft", time.Unix(0, at))
	assert.Equal(t, map[string]any{"m_u": 9223372036854775807.0, "m_i": -1.0, "m_f": -0.5, "m_b": true, "m_s": long}, v)

	sub := deadLetters(t, s)
	code, _ = s.post(t, "/api/v2/write", []byte(strings.Join(lines[4:], "\n")), nil)
	require.Equal(t, http.StatusBadRequest, code)
	for _, want := range []string{"too_far_in_future", "too_old"} {
		m, err := sub.NextMsg(5 * time.Second)
		require.NoError(t, err)
		assert.Equal(t, want, m.Header.Get(topology.HeaderErrorCode))
	}
}

func TestLineProtocolBodyLimit(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.MaxWriteBytes = 1024
	s := startService(t, cfg)
	at := testEpoch.Add(-time.Minute).UnixNano()
	// A body of exactly n bytes: lines padded with a string field.
	body := func(device string, n int) []byte {
		head := fmt.Sprintf("m,device=%s s=\"", device)
		tail := fmt.Sprintf("\" %d\n", at)
		return []byte(head + strings.Repeat("p", n-len(head)-len(tail)) + tail)
	}
	code, resp := s.post(t, "/write", body("lim-a", 1024), nil)
	assert.Equal(t, http.StatusNoContent, code, resp)
	code, resp = s.post(t, "/write", body("lim-b", 1025), nil)
	assert.Equal(t, http.StatusRequestEntityTooLarge, code, resp)

	// After gunzip: a small compressed body that inflates past the limit.
	code, resp = s.post(t, "/write", gz(t, body("lim-c", 1024)), map[string]string{"Content-Encoding": "gzip"})
	assert.Equal(t, http.StatusNoContent, code, resp)
	code, resp = s.post(t, "/write", gz(t, body("lim-d", 1025)), map[string]string{"Content-Encoding": "gzip"})
	assert.Equal(t, http.StatusRequestEntityTooLarge, code, resp)
	c, msg := influxBody(t, resp)
	assert.Equal(t, "request too large", c)
	assert.Contains(t, msg, "gunzipped")
	waitStored(t, s, "lim-a", 1)
	waitStored(t, s, "lim-c", 1)
	for _, d := range []string{"lim-b", "lim-d"} {
		code, _ := s.point(t, d, time.Unix(0, at))
		assert.Equal(t, http.StatusNotFound, code, d)
	}
}

func TestLineProtocolRetryStoresOnce(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute).UnixNano()
	var b strings.Builder
	for i := range 50 {
		fmt.Fprintf(&b, "m,device=retry-%d v=%di %d\n", i%5, i, at+int64(i)*1000)
	}
	b.WriteString("m,device=retry-0 v=oops\n")
	streamMsgs := func() (readings, rejected uint64) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, name := range readingStreams(t, s.js) {
			st, err := s.js.Stream(ctx, name)
			require.NoError(t, err)
			readings += st.CachedInfo().State.Msgs
		}
		st, err := s.js.Stream(ctx, "TELEMETRY_REJECTED")
		require.NoError(t, err)
		return readings, st.CachedInfo().State.Msgs
	}
	code, resp := s.post(t, "/api/v2/write", []byte(b.String()), nil)
	require.Equal(t, http.StatusBadRequest, code, resp)
	r1, d1 := streamMsgs()
	for range 2 {
		code, resp = s.post(t, "/api/v2/write", gz(t, []byte(b.String())), map[string]string{"Content-Encoding": "gzip"})
		require.Equal(t, http.StatusBadRequest, code, resp)
	}
	r2, d2 := streamMsgs()
	// The door remembers the messages its streams acknowledged by their
	// content's ID (ingest/lpwire): an identical retry publishes nothing.
	assert.Equal(t, r1, r2, "an identical retry is suppressed")
	assert.Equal(t, d1, d2, "a retried request adds no second dead letter")
	waitFor(t, 20*time.Millisecond, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, name := range readingStreams(t, s.js) {
			c, err := s.js.Consumer(ctx, name, "ingest")
			require.NoError(t, err)
			info, err := c.Info(ctx)
			require.NoError(t, err)
			if info.NumPending > 0 || info.NumAckPending > 0 {
				return false
			}
		}
		return true
	}, "the retries were never consumed")
	for d := range 5 {
		rs := pageAll(t, s, fmt.Sprintf("retry-%d", d), "asc", 1000, url.Values{})
		require.Len(t, rs, 10, "a retried request stores once")
		for i, r := range rs {
			assert.Equal(t, map[string]any{"m_v": float64(d + 5*i)}, r.Values)
		}
	}
}

func TestLineProtocolMessagesSplitAtTheMaxPayload(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Hour)
	// 12,000 readings of one device: more than one message holds.
	var b strings.Builder
	for i := range 12000 {
		fmt.Fprintf(&b, "m,device=big v=%di %d\n", i, at.Add(time.Duration(i)*time.Millisecond).UnixNano())
	}
	code, resp := s.post(t, "/api/v2/write", []byte(b.String()), nil)
	require.Equal(t, http.StatusNoContent, code, resp)
	waitStored(t, s, "big", 12000)
}

func TestQueryCreateDatabase(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	code, resp := s.post(t, "/query?q="+url.QueryEscape(`CREATE DATABASE "telegraf"`), nil, nil)
	assert.Equal(t, http.StatusOK, code, resp)
	assert.JSONEq(t, `{"results":[{"statement_id":0}]}`, resp)
	form := url.Values{"q": {"create database x; CREATE DATABASE y"}}
	code, resp = s.post(t, "/query", []byte(form.Encode()), map[string]string{"Content-Type": "application/x-www-form-urlencoded"})
	assert.Equal(t, http.StatusOK, code, resp)
	assert.JSONEq(t, `{"results":[{"statement_id":0},{"statement_id":1}]}`, resp)
	code, resp = s.post(t, "/query?q="+url.QueryEscape("SELECT * FROM cpu"), nil, nil)
	assert.Equal(t, http.StatusBadRequest, code, resp)
	assert.Contains(t, resp, "only CREATE DATABASE")
}

// TestLineProtocolWriteAuth: with an auth file a write needs a token
// with scope write (Token, Bearer or Basic); a token limited to some
// devices writes only their lines.
func TestLineProtocolWriteAuth(t *testing.T) {
	inLane(t, lanes.general)
	f := newAuthFixture(t, nil, "writer:write", "simwriter:write:sim-*", "reader:read")
	cfg := newTestConfig(t)
	cfg.Security.AuthFile = f.path
	m := openTestService(t, cfg)
	s := &testService{Main: m, cfg: cfg, base: "http://" + m.HTTPAddr()}
	at := testEpoch.Add(-time.Minute).UnixNano()
	body := []byte(fmt.Sprintf("m,device=sim-1 v=1 %d\nm,device=other v=2 %d\n", at, at))

	code, resp := s.post(t, "/api/v2/write", body, nil)
	assert.Equal(t, http.StatusUnauthorized, code, resp)
	code, resp = s.post(t, "/api/v2/write", body, map[string]string{"Authorization": "Token " + f.tokens["reader"]})
	assert.Equal(t, http.StatusForbidden, code, resp)

	code, resp = s.post(t, "/api/v2/write", body, map[string]string{"Authorization": "Token " + f.tokens["simwriter"]})
	require.Equal(t, http.StatusBadRequest, code, resp)
	_, msg := influxBody(t, resp)
	assert.Contains(t, msg, "partial write: 1 of 2 lines rejected; line 2: ")
	assert.Contains(t, msg, "device_not_allowed")
	code, resp = s.post(t, "/write", body[len(body)/2:], map[string]string{"Authorization": "Token " + f.tokens["simwriter"]})
	assert.Equal(t, http.StatusForbidden, code, resp)

	req, err := http.NewRequest(http.MethodPost, s.base+"/write?db=x", bytes.NewReader(body))
	require.NoError(t, err)
	req.SetBasicAuth("telegraf", f.tokens["writer"])
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	res.Body.Close()
	assert.Equal(t, http.StatusNoContent, res.StatusCode)
	waitFor(t, 20*time.Millisecond, func() bool {
		return latestCount(t, s.base, "other", f.tokens["reader"]) == 1 && latestCount(t, s.base, "sim-1", f.tokens["reader"]) == 1
	})
}

// TestLineProtocolPublishesOnItsOwnConnection checks that the write
// door publishes on a NATS connection of its own, apart from the one
// the ingester consumes on (their acks would queue behind its
// deliveries), and that the readings get stored.
func TestLineProtocolPublishesOnItsOwnConnection(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute).Truncate(time.Second)
	code, body := s.post(t, "/api/v2/write?bucket=b&precision=s", fmt.Appendf(nil, "env,device=own-conn v=1 %d\n", at.Unix()), nil)
	require.Equal(t, http.StatusNoContent, code, body)
	cz, err := s.nats.NATS().Connz(&server.ConnzOptions{})
	require.NoError(t, err)
	byName := map[string]*server.ConnInfo{}
	for _, c := range cz.Conns {
		byName[c.Name] = c
	}
	require.Contains(t, byName, "telemetryd-writes")
	require.Contains(t, byName, "telemetryd")
	assert.NotEqual(t, byName["telemetryd"].Cid, byName["telemetryd-writes"].Cid)
	assert.GreaterOrEqual(t, byName["telemetryd-writes"].InMsgs, int64(1), "the write was published on the door's connection")
	waitFor(t, 20*time.Millisecond, func() bool {
		code, _ := s.point(t, "own-conn", at)
		return code == http.StatusOK
	})
}

// TestLineWriteIsOneMessagePerPartition: the readings of one line
// protocol write (here 400 devices) go into each partition's stream as
// one message (ingest/lpwire), stored whole or not at all, and with
// -sync-writes fsynced once per stream; every reading is stored.
func TestLineWriteIsOneMessagePerPartition(t *testing.T) {
	inLane(t, lanes.general)
	for _, sync := range []bool{false, true} {
		t.Run(fmt.Sprintf("sync-writes=%v", sync), func(t *testing.T) {
			cfg := newTestConfig(t)
			cfg.SyncWrites = sync
			s := startService(t, cfg)
			at := testEpoch.Add(-time.Minute).UnixNano()
			var lines, devices []string
			for i := range 400 {
				dev := fmt.Sprintf("ab%03d", i)
				devices = append(devices, dev)
				lines = append(lines, fmt.Sprintf("m,device=%s v=%d %d", dev, i, at), fmt.Sprintf("m,device=%s v=%d %d", dev, i, at+1000))
			}
			code, resp := s.post(t, "/api/v2/write", []byte(strings.Join(lines, "\n")), nil)
			require.Equal(t, http.StatusNoContent, code, resp)
			for _, dev := range devices {
				waitStored(t, s, dev, 2)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			for p := range DefaultStreamPartitions {
				st, err := s.js.Stream(ctx, partition.Stream("TELEMETRY", p))
				require.NoError(t, err)
				info, err := st.Info(ctx, jetstream.WithSubjectFilter("telemetry.>"))
				require.NoError(t, err)
				assert.Equal(t, map[string]uint64{"telemetry." + strconv.Itoa(p) + "._lines": 1}, info.State.Subjects,
					"partition %d: one message of the write", p)
			}
		})
	}
}

// TestLineWritesOfEqualReadingsForOtherDevicesAreBothStored: two
// requests whose readings are equal but for their devices (of one
// partition) are two messages, and both are stored; only an identical
// request is suppressed.
func TestLineWritesOfEqualReadingsForOtherDevicesAreBothStored(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute).UnixNano()
	var devs []string
	for i := 0; len(devs) < 2; i++ {
		if d := fmt.Sprintf("eq-%d", i); partition.Of(DefaultStreamPartitions, d) == 0 {
			devs = append(devs, d)
		}
	}
	body := func(dev string) []byte {
		return fmt.Appendf(nil, "m,device=%s v=1i %d\nm,device=%s v=2i %d\n", dev, at, dev, at+1000)
	}
	for _, d := range devs {
		code, resp := s.post(t, "/api/v2/write", body(d), nil)
		require.Equal(t, http.StatusNoContent, code, resp)
	}
	code, resp := s.post(t, "/api/v2/write", body(devs[0]), nil)
	require.Equal(t, http.StatusNoContent, code, resp)
	for _, d := range devs {
		waitStored(t, s, d, 2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := s.js.Stream(ctx, partition.Stream("TELEMETRY", 0))
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("telemetry.>"))
	require.NoError(t, err)
	assert.Equal(t, map[string]uint64{"telemetry.0._lines": 2}, info.State.Subjects,
		"one message per request, the identical third suppressed")
}
