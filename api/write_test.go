package api_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/lineproto"
)

// recordingPublisher acknowledges every message at once and keeps what
// it was given.
type recordingPublisher struct {
	mu       sync.Mutex
	readings map[string]int // readings published per device
	messages int            // messages of readings
	dead     []linemsg.Message
}

func (p *recordingPublisher) Publish(_ context.Context, msgs []linemsg.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.readings == nil {
		p.readings = map[string]int{}
	}
	for _, m := range msgs {
		if m.DeadLetter {
			p.dead = append(p.dead, m)
			continue
		}
		p.messages++
		p.readings[m.Device] += wire.Count(m.Data)
	}
	return nil
}

// newWriteServer serves the write endpoints over loopback HTTP into pub.
func newWriteServer(t *testing.T, cfg api.WriteConfig, now time.Time) string {
	t.Helper()
	cfg.Mapper = lineproto.Mapper{}
	srv, err := api.New(api.Config{Reader: newFakeReader(), Logger: slog.New(slog.DiscardHandler),
		Now: func() time.Time { return now }, Writes: &cfg})
	require.NoError(t, err)
	hs := httptest.NewServer(srv.Handler())
	t.Cleanup(hs.Close)
	return hs.URL
}

func postLines(t *testing.T, url string, body []byte) (int, string) {
	t.Helper()
	resp, err := http.Post(url+"/api/v2/write?precision=ns", "text/plain", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// manyLines is n lines over devices devices, each line its own time,
// about 30 bytes a line.
func manyLines(n, devices int, at time.Time) []byte {
	var b []byte
	for i := range n {
		b = fmt.Appendf(b, "env,device=d-%d v=%d %d\n", i%devices, i, at.Add(time.Duration(i)*time.Millisecond).UnixNano())
	}
	return b
}

// A body of good lines larger than one mapping chunk is mapped whole:
// each device's readings travel in one message, not one per chunk. A
// body with a bad line is mapped in chunks as before: its dead letter
// names the line in the body and every good line is published.
func TestWriteMapsAGoodBodyWhole(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	const good, devices = 20_000, 7
	body := manyLines(good, devices, now.Add(-time.Hour))
	require.Greater(t, len(body), 2*256<<10, "the body spans several mapping chunks")

	t.Run("good", func(t *testing.T) {
		pub := &recordingPublisher{}
		url := newWriteServer(t, api.WriteConfig{Publisher: pub}, now)
		code, resp := postLines(t, url, body)
		require.Equal(t, http.StatusNoContent, code, resp)
		assert.Equal(t, devices, pub.messages, "one message per device")
		for d := range devices {
			assert.Equal(t, (good+devices-1-d)/devices, pub.readings[fmt.Sprintf("d-%d", d)], "device d-%d", d)
		}
	})
	t.Run("a bad line", func(t *testing.T) {
		pub := &recordingPublisher{}
		url := newWriteServer(t, api.WriteConfig{Publisher: pub}, now)
		bad := append(bytes.Clone(body), "env,device=d-0 v=\n"...)
		code, resp := postLines(t, url, bad)
		require.Equal(t, http.StatusBadRequest, code, resp)
		assert.Contains(t, resp, fmt.Sprintf("partial write: 1 of %d lines rejected; line %d: ", good+1, good+1))
		require.Len(t, pub.dead, 1)
		assert.True(t, strings.HasPrefix(pub.dead[0].Reason, fmt.Sprintf("line %d: ", good+1)), pub.dead[0].Reason)
		assert.Greater(t, pub.messages, devices, "mapped in chunks")
		n := 0
		for _, c := range pub.readings {
			n += c
		}
		assert.Equal(t, good, n)
	})
}

// When the write budget cannot pay for mapping a body whole and still
// hold the largest body besides, the body is mapped in chunks (and
// stored all the same), not refused.
func TestWriteMapsInChunksWhenTheBudgetIsShort(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	const good, devices = 40_000, 7
	body := manyLines(good, devices, now.Add(-time.Hour))
	maxBytes := int64(len(body)) + 1024
	whole := 9 * int64(len(body)) // the body and mapping it whole
	for _, tc := range []struct {
		name   string
		budget int64
		chunks bool
	}{
		// The floor holds the body and one chunk's mapping, not more.
		{"the floor", 1, true},
		// Room to map it whole, not to hold the largest body besides.
		{"no room besides", api.MinWriteBudget(maxBytes) + whole - 1<<20, true},
		{"room besides", api.MinWriteBudget(maxBytes) + whole + 1<<20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := &recordingPublisher{}
			url := newWriteServer(t, api.WriteConfig{Publisher: pub, MaxBytes: maxBytes, Budget: tc.budget}, now)
			code, resp := postLines(t, url, body)
			require.Equal(t, http.StatusNoContent, code, resp)
			if tc.chunks {
				assert.Greater(t, pub.messages, devices, "mapped in chunks")
			} else {
				assert.Equal(t, devices, pub.messages, "mapped whole")
			}
			n := 0
			for _, c := range pub.readings {
				n += c
			}
			assert.Equal(t, good, n)
		})
	}
}
