package ingest

import (
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"
)

// maxHeaderValue bounds the Telemetry-Error header.
const maxHeaderValue = 1024

// headerCarrier adapts NATS message headers to the OpenTelemetry text
// map propagators.
type headerCarrier nats.Header

var _ propagation.TextMapCarrier = headerCarrier(nil)

// Get returns the first value of key, matching the name exactly first
// and then without regard to case (publishers differ in spelling).
func (c headerCarrier) Get(key string) string {
	if vs := c[key]; len(vs) > 0 {
		return vs[0]
	}
	for k, vs := range c {
		if len(vs) > 0 && strings.EqualFold(k, key) {
			return vs[0]
		}
	}
	return ""
}

// Set replaces the values of key.
func (c headerCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the header names.
func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// headerValue makes s safe as a header value: control characters are
// escaped (a raw CR or LF would break the NATS protocol line), invalid
// UTF-8 is replaced and the result is cut to maxHeaderValue bytes.
func headerValue(s string) string {
	var b strings.Builder
	for _, r := range s {
		if b.Len() >= maxHeaderValue {
			b.WriteString("...")
			break
		}
		if r < 0x20 || r == 0x7f {
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
			continue
		}
		b.WriteRune(r) // invalid UTF-8 arrives as utf8.RuneError

	}
	return b.String()
}
