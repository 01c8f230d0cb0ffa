package main

import (
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func newTestFleet(t *testing.T, devices, batch int, now func() time.Time) (*fleet, config) {
	t.Helper()
	cfg := defaultConfig()
	cfg.Devices, cfg.Batch = devices, batch
	require.NoError(t, cfg.validate())
	return newFleet(cfg, 1, now), cfg
}

func TestFleetRoundRobinSubjectsAndMsgIDs(t *testing.T) {
	f, _ := newTestFleet(t, 3, 2, time.Now)
	var got []string
	for range 7 {
		m := f.nextMessage(2, nil)
		assert.Equal(t, 2, m.readings)
		got = append(got, m.subject+" "+m.msgID)
	}
	assert.Equal(t, []string{
		"telemetry.sim-0001 sim-0001-1", "telemetry.sim-0002 sim-0002-1", "telemetry.sim-0003 sim-0003-1",
		"telemetry.sim-0001 sim-0001-2", "telemetry.sim-0002 sim-0002-2", "telemetry.sim-0003 sim-0003-2",
		"telemetry.sim-0001 sim-0001-3",
	}, got)
}

func TestFleetSeqStart(t *testing.T) {
	cfg := defaultConfig()
	cfg.Devices, cfg.SeqStart = 1, 1000
	f := newFleet(cfg, 1, time.Now)
	assert.Equal(t, "sim-0001-1000", f.nextMessage(1, nil).msgID)
	assert.Equal(t, "sim-0001-1001", f.nextMessage(1, nil).msgID)
}

func TestFleetDeviceIDsAreValid(t *testing.T) {
	for _, i := range []int{1, 9999, 10000, 100000} {
		id := deviceID("sim-", i)
		assert.NoError(t, id.Validate(), "%s", id)
	}
	assert.Equal(t, buckets.DeviceID("sim-0001"), deviceID("sim-", 1))
	assert.Equal(t, buckets.DeviceID("sim-12345"), deviceID("sim-", 12345))
}

// With a frozen clock every reading of one device still gets its own
// instant, so none of them merge into another at the service: a
// microsecond apart in RFC 3339, a millisecond apart in epoch-ms.
func TestFleetTimestampsStrictlyIncreasePerDevice(t *testing.T) {
	frozen := time.Date(2026, 11, 22, 1, 2, 3, 456_000_000, time.UTC)
	for _, tt := range []struct {
		tsFormat string
		step     buckets.Ticks
	}{{"rfc3339", 10}, {"epoch-ms", 10_000}} {
		t.Run(tt.tsFormat, func(t *testing.T) {
			cfg := defaultConfig()
			cfg.Devices, cfg.Batch, cfg.TSFormat = 2, 50, tt.tsFormat
			f := newFleet(cfg, 1, func() time.Time { return frozen })
			last := map[string]buckets.Ticks{}
			for range 10 {
				m := f.nextMessage(50, nil)
				decoded := decodePayload(t, m.data, true)
				require.Len(t, decoded, 50)
				for _, r := range decoded {
					require.Greater(t, r.ticks, last[m.subject], "%s", m.subject)
					last[m.subject] = r.ticks
					assert.Equal(t, []string{"battery", "humidity", "temp"}, sortedKeys(r.values))
				}
			}
			assert.Equal(t, buckets.MustTicks(frozen)+249*tt.step, last["telemetry.sim-0001"], "250 readings one step apart from the clock")
		})
	}
}

// A reading a millisecond later than the previous one is stamped with
// the clock again: timestamps catch up instead of drifting.
func TestFleetTimestampsFollowClockAfterBurst(t *testing.T) {
	now := time.Date(2026, 11, 22, 1, 2, 3, 456_000_000, time.UTC)
	f, _ := newTestFleet(t, 1, 100, func() time.Time { return now })
	f.nextMessage(100, nil)
	now = now.Add(time.Millisecond)
	m := f.nextMessage(1, nil)
	assert.Contains(t, string(m.data), `"ts":"2026-11-22T01:02:03.457Z"`)
}

func TestFleetUsesClock(t *testing.T) {
	now := time.Date(2026, 11, 22, 1, 2, 3, 456_000_000, time.UTC)
	f, _ := newTestFleet(t, 1, 1, func() time.Time { return now })
	m := f.nextMessage(1, nil)
	assert.Contains(t, string(m.data), `"ts":"2026-11-22T01:02:03.456Z"`)
	now = now.Add(time.Hour)
	m = f.nextMessage(1, nil)
	assert.Contains(t, string(m.data), `"ts":"2026-11-22T02:02:03.456Z"`)
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }
