package natsembed

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A power cut that keeps a stream's meta.inf and loses its meta.sum
// made the server skip the stream at every later start; the repair
// rewrites the checksum, so the same stream (same creation time, same
// messages) comes back.
func TestStreamWithLostChecksumIsRecovered(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := func() (*Server, jetstream.JetStream) { return startOn(t, dir) }
	srv, js := start()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "READINGS", Subjects: []string{"r.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	created := st.CachedInfo().Created
	for range 3 {
		_, err := js.Publish(ctx, "r.a", []byte("x"))
		require.NoError(t, err)
	}
	srv.Shutdown()

	sum := filepath.Join(dir, "jetstream", "$G", "streams", "READINGS", "meta.sum")
	good, err := os.ReadFile(sum)
	require.NoError(t, err)
	require.NotEmpty(t, good)
	require.NoError(t, os.WriteFile(sum, nil, 0o640), "as a cut between the two writes leaves it")

	srv, js = start()
	defer srv.Shutdown()
	st, err = js.Stream(ctx, "READINGS")
	require.NoError(t, err, "the stream is recovered, not skipped")
	assert.True(t, created.Equal(st.CachedInfo().Created), "the same stream, not a new one of that name")
	assert.Equal(t, uint64(3), st.CachedInfo().State.Msgs)
	got, err := os.ReadFile(sum)
	require.NoError(t, err)
	assert.Equal(t, string(good), string(got), "the server's own checksum")
}

// A torn or empty meta.inf is left for the server to skip: there is no
// configuration to vouch for.
func TestRepairLeavesIncompleteMetadata(t *testing.T) {
	dir := t.TempDir()
	stream := filepath.Join(dir, "jetstream", "$G", "streams", "S")
	require.NoError(t, os.MkdirAll(stream, 0o755))
	for _, inf := range []string{"", `{"name":"S","subj`} {
		require.NoError(t, os.WriteFile(filepath.Join(stream, "meta.inf"), []byte(inf), 0o640))
		require.NoError(t, os.WriteFile(filepath.Join(stream, "meta.sum"), nil, 0o640))
		repaired, err := repairStreamSums(dir, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		assert.Empty(t, repaired, "meta.inf %q", inf)
		got, err := os.ReadFile(filepath.Join(stream, "meta.sum"))
		require.NoError(t, err)
		assert.Empty(t, got)
	}
}

// A power cut soon after a consumer was created left its meta.inf
// empty: the server skipped the consumer at every later start, and the
// consumer its owner created again took over the old one's delivery
// counts, until messages reached MaxDeliver without a failed write. The
// repair removes such a consumer before the server starts: created
// again, it delivers each message as for the first time, and it is
// still there after the next start.
func TestConsumerWithEmptyMetadataIsCreatedAfresh(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "nats")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := func() (*Server, jetstream.JetStream) { return startOn(t, dir) }
	ccfg := jetstream.ConsumerConfig{Durable: "C", AckPolicy: jetstream.AckExplicitPolicy, MaxDeliver: 10, AckWait: 2 * time.Second}
	// deliveries fetches the first message and naks it (so it is
	// delivered again at once), returning its delivery count.
	deliveries := func(js jetstream.JetStream, cons jetstream.Consumer) uint64 {
		t.Helper()
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		var n uint64
		for m := range batch.Messages() {
			md, err := m.Metadata()
			require.NoError(t, err)
			n = md.NumDelivered
			require.NoError(t, m.Nak())
		}
		require.NoError(t, batch.Error())
		require.NoError(t, js.Conn().Flush(), "the nak reached the server")
		require.NotZero(t, n, "a message was delivered")
		return n
	}
	srv, js := start()
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "READINGS", Subjects: []string{"r.>"}, Storage: jetstream.FileStorage})
	require.NoError(t, err)
	_, err = js.Publish(ctx, "r.a", []byte("x"))
	require.NoError(t, err)
	cons, err := js.CreateOrUpdateConsumer(ctx, "READINGS", ccfg)
	require.NoError(t, err)
	for want := uint64(1); want <= 4; want++ {
		require.Equal(t, want, deliveries(js, cons))
	}
	srv.Shutdown()

	meta := filepath.Join(dir, "jetstream", "$G", "streams", "READINGS", "obs", "C", "meta.inf")
	require.FileExists(t, meta)
	require.NoError(t, os.WriteFile(meta, nil, 0o640), "as a cut after the consumer's creation leaves it")

	srv, js = start()
	_, err = js.Consumer(ctx, "READINGS", "C")
	require.ErrorIs(t, err, jetstream.ErrConsumerNotFound, "the broken consumer is gone")
	cons, err = js.CreateOrUpdateConsumer(ctx, "READINGS", ccfg)
	require.NoError(t, err)
	assert.Equal(t, uint64(1), deliveries(js, cons), "created again, it delivers as for the first time, not a fifth time")
	srv.Shutdown()

	srv, js = start()
	defer srv.Shutdown()
	cons, err = js.Consumer(ctx, "READINGS", "C")
	require.NoError(t, err, "created again, the consumer has its metadata and is recovered")
	assert.Equal(t, uint64(2), deliveries(js, cons))
}

// Only a consumer the server would skip is removed: one whose meta.inf
// is empty, torn or missing, or whose meta.sum is missing; a complete
// one and an encrypted one stay.
func TestRemoveBrokenConsumersRemovesOnlyWhatTheServerSkips(t *testing.T) {
	for _, tc := range []struct {
		name   string
		files  map[string]string
		remove bool
	}{
		{"complete", map[string]string{"meta.inf": `{"name":"C"}`, "meta.sum": "abc", "o.dat": "x"}, false},
		{"empty meta.inf", map[string]string{"meta.inf": "", "meta.sum": "abc", "o.dat": "x"}, true},
		{"torn meta.inf", map[string]string{"meta.inf": `{"name":"C","con`, "meta.sum": "abc"}, true},
		{"no meta.inf", map[string]string{"o.dat": "x"}, true},
		{"no meta.sum", map[string]string{"meta.inf": `{"name":"C"}`}, true},
		{"encrypted", map[string]string{"meta.inf": "\x01\x02", "meta.sum": "abc", "meta.key": "k"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cons := filepath.Join(dir, "jetstream", "$G", "streams", "S", "obs", "C")
			require.NoError(t, os.MkdirAll(cons, 0o755))
			for name, data := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(cons, name), []byte(data), 0o640))
			}
			removed, err := removeBrokenConsumers(dir, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			if tc.remove {
				assert.Equal(t, []string{"$G/S/C"}, removed)
				assert.NoDirExists(t, cons)
				assert.DirExists(t, filepath.Dir(cons), "the stream's consumers directory stays")
			} else {
				assert.Empty(t, removed)
				assert.DirExists(t, cons)
			}
		})
	}
}

// startOn starts an embedded server on the store dir dir, and a
// JetStream client of it closed with the test.
func startOn(t *testing.T, dir string) (*Server, jetstream.JetStream) {
	t.Helper()
	srv, err := Start(Config{Listen: "127.0.0.1:0", StoreDir: dir, SyncInterval: time.Second})
	require.NoError(t, err)
	nc, err := nats.Connect(srv.ClientURL(), srv.ClientOptions()...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	return srv, js
}
