package topology_test

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"

	"github.com/telemetryd/telemetryd/ingest/topology"
)

func TestSubjects(t *testing.T) {
	s := topology.For("site1.telemetry")
	assert.Equal(t, "site1.telemetry.dev-1", s.Device("dev-1"))
	assert.Equal(t, "site1.telemetry.*", s.All())
	assert.Equal(t, "dev-1", s.DeviceToken("site1.telemetry.dev-1"))
	assert.Equal(t, "", s.DeviceToken("other.dev-1"))
	assert.Equal(t, "rejected.site1.telemetry.dev-1", s.Rejected("dev-1"))
	assert.Equal(t, "rejected.site1.telemetry.*", s.RejectedAll())
	assert.True(t, topology.IsRejected(s.Rejected(topology.InvalidDeviceToken)))
	assert.False(t, topology.IsRejected(s.Device("rejected")))
	assert.Equal(t, "$MQTT.msgs.site1.telemetry.*", s.MQTTCopies())
}

func TestMQTTCopiesTransform(t *testing.T) {
	s := topology.For("telemetry")
	tr := s.MQTTCopiesTransform()
	assert.Equal(t, jetstream.SubjectTransformConfig{Source: "$MQTT.msgs.telemetry.*", Destination: "telemetry.{{wildcard(1)}}"}, tr)
	assert.True(t, s.IsMQTTCopiesTransform(&tr))
	assert.False(t, s.IsMQTTCopiesTransform(nil))
	assert.False(t, topology.For("other").IsMQTTCopiesTransform(&tr), "another prefix's transform")
	assert.False(t, s.IsMQTTCopiesTransform(&jetstream.SubjectTransformConfig{Source: "telemetry.*", Destination: "telemetry.{{partition(4,1)}}.{{wildcard(1)}}"}))
}
