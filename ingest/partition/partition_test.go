package partition_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/partition"
)

// TestOfMatchesTheServer: the partition the stream's subject transform
// stores a device under is the one Of computes, for every device.
func TestOfMatchesTheServer(t *testing.T) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true})
	require.NoError(t, err)
	ns.Start()
	t.Cleanup(ns.Shutdown)
	require.True(t, ns.ReadyForConnections(10*time.Second))
	nc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, n := range []int{1, 7, 12, 64} {
		tr := partition.Transform("site1.telemetry", n)
		name := fmt.Sprintf("P%d", n)
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"site1.telemetry.*"}, SubjectTransform: &tr})
		require.NoError(t, err)
		const devices = 300
		for i := range devices {
			_, err := js.Publish(ctx, fmt.Sprintf("site1.telemetry.dev-%d", i), []byte("{}"))
			require.NoError(t, err)
		}
		st, err := js.Stream(ctx, name)
		require.NoError(t, err)
		seen := map[int]bool{}
		for seq := uint64(1); seq <= devices; seq++ {
			msg, err := st.GetMsg(ctx, seq)
			require.NoError(t, err)
			dev := partition.DeviceToken("site1.telemetry", msg.Subject)
			p := partition.Of(n, dev)
			seen[p] = true
			assert.Equal(t, fmt.Sprintf("site1.telemetry.%d.%s", p, dev), msg.Subject)
		}
		assert.Len(t, seen, n, "n=%d: every partition gets devices", n)
		got, err := partition.Count("site1.telemetry", st.CachedInfo().Config.SubjectTransform)
		require.NoError(t, err)
		assert.Equal(t, n, got)
		require.NoError(t, js.DeleteStream(ctx, name))
	}
}

func TestCount(t *testing.T) {
	tr := partition.Transform("telemetry", 12)
	n, err := partition.Count("telemetry", &tr)
	require.NoError(t, err)
	assert.Equal(t, 12, n)

	_, err = partition.Count("telemetry", nil)
	assert.ErrorIs(t, err, partition.ErrNotPartitioned)
	// Any other transform is not a partitioning: the ingester tells its
	// own transforms (the MQTT copies') apart before asking.
	_, err = partition.Count("telemetry", &jetstream.SubjectTransformConfig{Source: "$MQTT.msgs.telemetry.*", Destination: "telemetry.{{wildcard(1)}}"})
	assert.ErrorContains(t, err, "not the partitioning of telemetry.*")
	_, err = partition.Count("other", &tr)
	assert.ErrorContains(t, err, "not the partitioning of other.*")
	_, err = partition.Count("telemetry", &jetstream.SubjectTransformConfig{Source: "telemetry.*", Destination: "telemetry.{{partition(0,1)}}.{{wildcard(1)}}"})
	assert.Error(t, err)
	_, err = partition.Count("telemetry", &jetstream.SubjectTransformConfig{Source: "telemetry.*", Destination: "x.{{wildcard(1)}}"})
	assert.Error(t, err)
}

func TestFilter(t *testing.T) {
	assert.Equal(t, "telemetry.3.>", partition.Filter("telemetry", 3))
}

func TestValidateAndDeviceToken(t *testing.T) {
	assert.Error(t, partition.Validate(0))
	assert.NoError(t, partition.Validate(1))
	assert.NoError(t, partition.Validate(partition.Max))
	assert.ErrorContains(t, partition.Validate(partition.Max+1), "1 to 1024")

	assert.Equal(t, "dev-1", partition.DeviceToken("telemetry", "telemetry.3.dev-1"))
	assert.Equal(t, ">", partition.DeviceToken("telemetry", "telemetry.3.>"))
	assert.Equal(t, "", partition.DeviceToken("telemetry", "telemetry.dev-1"))
	assert.Equal(t, "", partition.DeviceToken("telemetry", "telemetry.x.dev-1"))
	assert.Equal(t, "", partition.DeviceToken("telemetry", "other.3.dev-1"))
}

// TestOfIsFNV1a pins the function: FNV-1a 32 of the ID modulo n, so
// nodes built from different versions agree on the owners.
func TestOfIsFNV1a(t *testing.T) {
	// FNV-1a 32 of "a" is 0xe40c292c (the published test vector).
	assert.Equal(t, int(uint32(0xe40c292c)%12), partition.Of(12, "a"))
	assert.Equal(t, 0, partition.Of(1, "anything"))
}
