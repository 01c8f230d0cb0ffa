package api_test

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
)

// clientFrom returns an HTTP client whose connections come from ip, a
// loopback address other than 127.0.0.1: another client to the server.
func clientFrom(ip string) *http.Client {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	return &http.Client{Transport: &http.Transport{DialContext: d.DialContext}}
}

func getWith(t *testing.T, c *http.Client, url string) response {
	t.Helper()
	res, err := c.Get(url)
	require.NoError(t, err)
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{res.StatusCode, res.Header, body}
}

// A client holds at most its share of the queries in flight and of the
// response budget: at the share its next query gets 429 with
// Retry-After, naming the share, while another client is served.
func TestClientShares(t *testing.T) {
	const perPage = 10000 * 256
	env := newTestEnv(t, func(c *api.Config) {
		c.MaxInFlight, c.ClientShares = 4, 2 // two queries a client
		c.ResponseBudget = 4 * perPage       // two full pages a client
	})
	wideReadings(t, env, "dev-c", 100, 10)
	env.reader.hold(4)
	held := make(chan int, 2)
	for range 2 { // the share of 127.0.0.1, both ways
		go func() { held <- env.get(t, rangePath("dev-c", 10000)).status }()
	}
	for range 2 {
		select {
		case <-env.reader.entered:
		case <-time.After(5 * time.Second):
			t.Fatal("queries did not reach the reader")
		}
	}
	r := env.get(t, "/v1/devices/dev-c/readings/latest?limit=1")
	requireError(t, r, http.StatusTooManyRequests, "resource_exhausted", "request")
	assert.Contains(t, string(r.body), "this client has 2 queries in flight, its share of 4")
	assert.Equal(t, "1", r.header.Get("Retry-After"))

	// Another client address: its own share, and budget left for it.
	other := clientFrom("127.0.0.2")
	done := make(chan response, 1)
	go func() { done <- getWith(t, other, env.url+rangePath("dev-c", 10000)) }()
	select {
	case <-env.reader.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the other client's query did not reach the reader")
	}
	env.reader.mu.Lock()
	close(env.reader.gate)
	env.reader.gate = nil
	env.reader.mu.Unlock()
	assert.Equal(t, http.StatusOK, (<-done).status)
	for range 2 {
		assert.Equal(t, http.StatusOK, <-held)
	}
}

// Past its share of the response budget (though under its share of
// queries) a client gets 429 naming the budget share, not 503.
func TestClientShareOfTheResponseBudget(t *testing.T) {
	const perPage = 10000 * 256
	env := newTestEnv(t, func(c *api.Config) {
		c.ClientShares = 2
		c.ResponseBudget = 2 * perPage // one full page a client
	})
	wideReadings(t, env, "dev-d", 100, 10)
	env.reader.hold(2)
	held := make(chan int, 1)
	go func() { held <- env.get(t, rangePath("dev-d", 10000)).status }()
	<-env.reader.entered
	r := env.get(t, "/v1/devices/dev-d/readings/latest?limit=1")
	requireError(t, r, http.StatusTooManyRequests, "resource_exhausted", "query responses")
	assert.Contains(t, string(r.body), "this client's share of the memory budget for responses in flight")
	assert.Equal(t, "1", r.header.Get("Retry-After"))
	env.reader.mu.Lock()
	close(env.reader.gate)
	env.reader.gate = nil
	env.reader.mu.Unlock()
	assert.Equal(t, http.StatusOK, <-held)
	assert.Equal(t, http.StatusOK, env.get(t, "/v1/devices/dev-d/readings/latest?limit=1").status, "the share came back")
	assert.Equal(t, http.StatusOK, getWith(t, clientFrom("127.0.0.3"), env.url+"/v1/devices/dev-d/readings/latest?limit=1").status)
}
