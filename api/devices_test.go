package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestDevicesJSONShape(t *testing.T) {
	env := newTestEnv(t)
	env.reader.devices = []buckets.DeviceInfo{{
		Device:    "dev-1",
		FirstSeen: mustTicks(t, "2026-11-01T00:00:00.5Z"),
		LastSeen:  mustTicks(t, contractTS),
		Latest:    []buckets.Field{{Name: "ok", Value: buckets.Bool(true)}, {Name: "temp", Value: buckets.Float(21.5)}},
	}}
	res := env.get(t, "/v1/devices")
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	body := res.json(t)
	assert.Equal(t, []string{"devices"}, keys(body), "no next when nothing remains")
	devs := body["devices"].([]any)
	require.Len(t, devs, 1)
	assert.Equal(t, map[string]any{}, devs[0].(map[string]any)["attributes"], "no attributes: an empty object")
	env.reader.setAttributes("dev-1", "fleet", "East", "model", "F-150")
	res = env.get(t, "/v1/devices")
	require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
	devs = res.json(t)["devices"].([]any)
	require.Len(t, devs, 1)
	assert.Equal(t, map[string]any{
		"device":     "dev-1",
		"attributes": map[string]any{"fleet": "East", "model": "F-150"},
		"firstSeen":  "2026-11-01T00:00:00.5Z",
		"lastSeen":   contractTS,
		"latest":     map[string]any{"ok": true, "temp": json.Number("21.5")},
	}, devs[0])
	assert.Equal(t, []devicesArgs{{"", "", 100}, {"", "", 100}}, env.reader.devArgs, "default limit 100")
}

func TestDevicesEmptyListIsAnArray(t *testing.T) {
	env := newTestEnv(t)
	res := env.get(t, "/v1/devices?prefix=nobody")
	require.Equal(t, http.StatusOK, res.status)
	assert.JSONEq(t, `{"devices":[]}`, string(res.body))
}

func TestDevicesParameters(t *testing.T) {
	tests := []struct {
		query, param string
		want         *devicesArgs
	}{
		{"?limit=1", "", &devicesArgs{"", "", 1}},
		{"?limit=1000", "", &devicesArgs{"", "", 1000}},
		{"?limit=0", "limit", nil},
		{"?limit=1001", "limit", nil},
		{"?prefix=sensor-", "", &devicesArgs{"sensor-", "", 100}},
		{"?prefix=" + strings.Repeat("a", 64), "", &devicesArgs{strings.Repeat("a", 64), "", 100}},
		{"?prefix=" + strings.Repeat("a", 65), "prefix", nil},
		{"?prefix=a.b", "prefix", nil},
		{"?prefix=-a", "prefix", nil},
		{"?prefix=a%2Fb", "prefix", nil},
		{"?cursor=garbage", "cursor", nil},
	}
	for _, tt := range tests {
		t.Run(tt.query, func(t *testing.T) {
			env := newTestEnv(t)
			res := env.get(t, "/v1/devices"+tt.query)
			if tt.param != "" {
				requireError(t, res, http.StatusBadRequest, "invalid_argument", tt.param)
				assert.Empty(t, env.reader.devArgs)
				return
			}
			require.Equal(t, http.StatusOK, res.status, "body: %s", res.body)
			assert.Equal(t, []devicesArgs{*tt.want}, env.reader.devArgs)
		})
	}
}

func TestDevicesPaging(t *testing.T) {
	env := newTestEnv(t)
	for i := range 7 {
		env.reader.devices = append(env.reader.devices, buckets.DeviceInfo{Device: buckets.DeviceID(fmt.Sprintf("sensor-%d", i))})
	}
	env.reader.devices = append(env.reader.devices, buckets.DeviceInfo{Device: "zeta"})

	var got []string
	next := ""
	for i := 0; ; i++ {
		require.Less(t, i, 5, "too many pages")
		query := "?prefix=sensor-&limit=3"
		if next != "" {
			query = "?limit=3&cursor=" + next // prefix comes from the cursor
		}
		body := env.get(t, "/v1/devices"+query).json(t)
		for _, d := range body["devices"].([]any) {
			got = append(got, d.(map[string]any)["device"].(string))
		}
		n, ok := body["next"]
		if !ok {
			break
		}
		next = n.(string)
	}
	assert.Equal(t, []string{"sensor-0", "sensor-1", "sensor-2", "sensor-3", "sensor-4", "sensor-5", "sensor-6"}, got)
	assert.Equal(t, []devicesArgs{{"sensor-", "", 3}, {"sensor-", "sensor-2", 3}, {"sensor-", "sensor-5", 3}}, env.reader.devArgs)

	t.Run("cursor of another prefix", func(t *testing.T) {
		body := env.get(t, "/v1/devices?prefix=sensor-&limit=1").json(t)
		cur := body["next"].(string)
		requireError(t, env.get(t, "/v1/devices?prefix=zeta&cursor="+cur), http.StatusBadRequest, "invalid_argument", "cursor")
		res := env.get(t, "/v1/devices?prefix=sensor-&cursor="+cur)
		assert.Equal(t, http.StatusOK, res.status, "the same prefix repeated is fine")
	})
	t.Run("range cursor on devices", func(t *testing.T) {
		env.reader.add(reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:00Z"), 1),
			reading(t, "dev-1", mustTicks(t, "2026-11-22T10:00:01Z"), 1))
		_, rc := page(t, env, "dev-1", "?limit=1")
		requireError(t, env.get(t, "/v1/devices?cursor="+rc), http.StatusBadRequest, "invalid_argument", "cursor")
	})
}
