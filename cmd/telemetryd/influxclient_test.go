package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestInfluxDBGoClientWrites writes through /api/v2/write with the
// official InfluxDB 2 Go client, plain and gzip-compressed.
func TestInfluxDBGoClientWrites(t *testing.T) {
	inLane(t, lanes.general)
	s := startService(t, newTestConfig(t))
	at := testEpoch.Add(-time.Minute)
	for _, gzip := range []bool{false, true} {
		device := fmt.Sprintf("influx-gzip-%v", gzip)
		client := influxdb2.NewClientWithOptions(s.base, "any-token",
			influxdb2.DefaultOptions().SetUseGZip(gzip).SetPrecision(time.Millisecond))
		w := client.WriteAPIBlocking("fleet", "readings")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		p := influxdb2.NewPoint("env",
			map[string]string{"device": device, "site": "north"},
			map[string]any{"temp": 21.5, "n": int64(3), "u": uint64(5), "ok": true, "note": "dry"},
			at)
		require.NoError(t, w.WritePoint(ctx, p))
		var recs []string
		for i := 1; i <= 100; i++ {
			recs = append(recs, fmt.Sprintf("power,host=%s watts=%d.5 %d", device, i, at.Add(time.Duration(i)*time.Second).UnixMilli()))
		}
		require.NoError(t, w.WriteRecord(ctx, recs...))
		// A bad record is refused with the partial-write message.
		err := w.WriteRecord(ctx, "power watts=1")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "partial write: 1 of 1 lines rejected")
		cancel()
		client.Close()

		waitStored(t, s, device, 101)
		code, v := s.point(t, device, at)
		require.Equal(t, http.StatusOK, code)
		assert.Equal(t, map[string]any{"env_temp": 21.5, "env_n": 3.0, "env_u": 5.0, "env_ok": true,
			"env_note": "dry"}, v)
		waitAttributes(t, s, device, map[string]string{"site": "north"})
		_, v = s.point(t, device, at.Add(100*time.Second))
		assert.Equal(t, map[string]any{"power_watts": 100.5}, v)
	}
}
