package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPostLinesSendsEveryReadingOnce runs the line protocol writers
// (each building its next body while one is in flight) against a server
// that records every line.
func TestPostLinesSendsEveryReadingOnce(t *testing.T) {
	w := newWorkload(deviceIDs(30), 23_450, 100, time.Second, time.Now().Add(-time.Minute))
	var mu sync.Mutex
	seen := map[string]int{}
	requests := 0
	hs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		mu.Lock()
		requests++
		for line := range bytes.SplitSeq(bytes.TrimSuffix(body, []byte{'\n'}), []byte{'\n'}) {
			seen[string(line)]++
		}
		mu.Unlock()
		rw.WriteHeader(http.StatusNoContent)
	}))
	defer hs.Close()
	_, err := postLines(context.Background(), hs.URL, w)
	require.NoError(t, err)
	want := map[string]int{}
	for m := range w.msgs {
		for i := range w.perMsg {
			want[string(bytes.TrimSuffix(w.appendLine(nil, m, i), []byte{'\n'}))]++
		}
	}
	assert.Equal(t, want, seen)
	assert.Equal(t, (w.msgs+connectLinesPerRequest/w.perMsg-1)/(connectLinesPerRequest/w.perMsg), requests)
}

func TestPostLinesStopsAtAnError(t *testing.T) {
	w := newWorkload(deviceIDs(30), 50_000, 100, time.Second, time.Now().Add(-time.Minute))
	hs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(rw, "no", http.StatusServiceUnavailable)
	}))
	defer hs.Close()
	_, err := postLines(context.Background(), hs.URL, w)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "503")
}

// BenchmarkGenerate is what the load generator spends building one
// reading for each door of the connect phase: a line of line protocol
// and a reading of the JSON payload at 100 readings per message.
func BenchmarkGenerate(b *testing.B) {
	w := newWorkload(deviceIDs(1000), 1_000_000, 100, time.Second, time.Now().Add(-time.Minute))
	b.Run("line", func(b *testing.B) {
		buf := make([]byte, 0, 64*connectLinesPerRequest)
		for b.Loop() {
			buf = buf[:0]
			for i := range w.perMsg {
				buf = w.appendLine(buf, 7, i)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*w.perMsg), "ns/reading")
	})
	b.Run("json", func(b *testing.B) {
		for b.Loop() {
			w.natsMsg(7)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*w.perMsg), "ns/reading")
	})
}

// TestDoorsRunTheirBaselines: a door runs with the baseline it is
// measured against, and no other door's runs.
func TestDoorsRunTheirBaselines(t *testing.T) {
	names := func(doors ...string) []string {
		var out []string
		for _, r := range connectRuns() {
			if wanted(r, doors) {
				out = append(out, r.Name)
			}
		}
		return out
	}
	assert.Equal(t, []string{"JSON over JetStream, 1/msg", "MQTT QoS 1, 1/msg, paho client"}, names("mqtt-paho"))
	assert.Equal(t, []string{"JSON over JetStream, 1/msg", "MQTT QoS 1, 1/msg"}, names("mqtt"))
	assert.Equal(t, []string{"JSON over JetStream, 100/msg", "line protocol, 5000 lines/request, 2 writers"}, names("line"))
	assert.Equal(t, []string{"line protocol, 5000 lines/request, 2 writers", "line protocol, 5000 lines/request, 2 writers, sync-writes",
		"line protocol, 5000 lines/request of 1000 devices, 2 writers", "line protocol, 5000 lines/request of 1000 devices, 2 writers, sync-writes"},
		names("line-sync"))
	assert.Equal(t, []string{"MQTT QoS 1, 1/msg", "MQTT QoS 1, 1/msg, sync-writes"}, names("mqtt-sync"))
	assert.Len(t, names(), len(connectRuns())-4, "every run but those of the two -sync doors")
	assert.NotContains(t, names(), "MQTT QoS 1, 1/msg, sync-writes")
	for _, r := range connectRuns() {
		if r.Base != "" {
			// A baseline runs without -sync-writes, and is itself a
			// baseline unless its door is the same door with it.
			assert.True(t, slices.ContainsFunc(connectRuns(), func(b connectRun) bool {
				return b.Name == r.Base && !b.Sync && (r.Sync || b.Base == "") && b.PerMsg == r.PerMsg
			}), r.Name)
		}
	}
}
