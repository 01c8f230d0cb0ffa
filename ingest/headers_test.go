package ingest

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/topology"
)

func TestHeaderValue(t *testing.T) {
	assert.Equal(t, `reading 0: values.a\nb\r: bad`, headerValue("reading 0: values.a\nb\r: bad"))
	assert.Equal(t, "caf\u00e9 \uFFFD", headerValue("café \xff"))
	long := headerValue(strings.Repeat("x", 5000))
	assert.Equal(t, maxHeaderValue+len("..."), len(long))
	assert.True(t, strings.HasSuffix(long, "..."))
}

func TestHeaderCarrier(t *testing.T) {
	c := headerCarrier(nats.Header{"Traceparent": []string{"a"}, "tracestate": []string{"b"}})
	assert.Equal(t, "a", c.Get("traceparent"), "any spelling")
	assert.Equal(t, "b", c.Get("tracestate"))
	assert.Empty(t, c.Get("baggage"))
	c.Set("baggage", "k=v")
	assert.Equal(t, "k=v", nats.Header(c).Get("baggage"))
	assert.ElementsMatch(t, []string{"Traceparent", "tracestate", "baggage"}, c.Keys())
}

func TestNakDelay(t *testing.T) {
	cfg := Config{BackOff: []time.Duration{time.Second, 5 * time.Second}}
	assert.Equal(t, time.Second, cfg.nakDelay(0))
	assert.Equal(t, time.Second, cfg.nakDelay(1))
	assert.Equal(t, 5*time.Second, cfg.nakDelay(2))
	assert.Equal(t, 5*time.Second, cfg.nakDelay(9))
}

// A value name with a newline ends up in the Telemetry-Error header
// escaped, so the dead letter is still a valid NATS message.
func TestIngestDeadLetterHeaderIsEscaped(t *testing.T) {
	e := newTestEnv(t, nil)
	e.start()
	payload := `{"a\nb":1}`
	e.publish("telemetry.dev-1", payload)
	dl := e.waitDeadLetters(1)
	require.Len(t, dl, 1)
	assert.Equal(t, "invalid_value_name", dl[0].Header.Get(topology.HeaderErrorCode))
	assert.Equal(t, `reading 0: values.a\nb: name has byte 0x0a at byte 1; only A-Z a-z 0-9 _ . - are allowed`,
		dl[0].Header.Get(topology.HeaderError))
	assert.Equal(t, payload, string(dl[0].Data))
}
