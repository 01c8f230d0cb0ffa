package ingesttest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/ingest/ingesttest"
)

func TestRunNATSServesJetStream(t *testing.T) {
	dir := t.TempDir()
	srv := ingesttest.RunNATS(t, func(o *server.Options) { o.StoreDir = dir })
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.*"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	ack, err := js.Publish(ctx, "t.x", []byte("1"))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), ack.Sequence)
	assert.DirExists(t, dir+"/jetstream", "the store is where the option put it")
}
