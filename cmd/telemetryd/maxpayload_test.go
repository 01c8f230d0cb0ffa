package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/assert"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
)

// TestExternalNATSMaxPayloadWarning: with -nats-url, the service warns
// at start when the server accepts smaller messages than the embedded
// server does (NATS's 1 MiB default), and says nothing when it accepts
// as much.
func TestExternalNATSMaxPayloadWarning(t *testing.T) {
	inLane(t, lanes.general)
	const warning = "max_payload is below what telemetryd publishes"
	for _, tc := range []struct {
		name       string
		maxPayload int32
		warns      bool
	}{
		{"default 1MiB", 0, true},
		{"8MiB", natsembed.DefaultMaxPayload, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ns := ingesttest.RunNATS(t, func(o *server.Options) {
				o.StoreDir = dir
				if tc.maxPayload > 0 {
					o.MaxPayload = tc.maxPayload
				}
			})
			cfg := newTestConfig(t)
			cfg.NATSURL = ns.ClientURL()
			var logs lockedBuffer
			startService(t, cfg, func(m *Main) {
				m.log = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testLogWriter(t)), nil))
			})
			if tc.warns {
				waitFor(t, 10*time.Millisecond, func() bool { return strings.Contains(logs.String(), warning) })
				assert.Contains(t, logs.String(), `max_payload="1.0 MiB"`)
				assert.Equal(t, 1, strings.Count(logs.String(), warning), "warned once, by the main connection")
				return
			}
			time.Sleep(200 * time.Millisecond) // the check runs on connect, asynchronously
			assert.NotContains(t, logs.String(), warning)
		})
	}
}
