package natsembed

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets/bucketstest"
)

// roundTrip checks that a message published on pub reaches sub.
func roundTrip(t *testing.T, pub, sub *nats.Conn) {
	t.Helper()
	s, err := sub.SubscribeSync("link.test")
	require.NoError(t, err)
	require.NoError(t, sub.Flush())
	require.NoError(t, pub.Publish("link.test", []byte("hi")))
	msg, err := s.NextMsg(10 * time.Second)
	require.NoError(t, err)
	assert.Equal(t, "hi", string(msg.Data))
}

// Without a URL the link starts the embedded server, calls Started
// before connecting, and every Dial reaches it as its internal user.
func TestOpenLinkEmbedded(t *testing.T) {
	logs := &bucketstest.SyncBuffer{}
	var started *Server
	l, nc, err := OpenLink(LinkConfig{
		Embedded: func() Config {
			return Config{Listen: "127.0.0.1:0", StoreDir: filepath.Join(t.TempDir(), "nats")}
		},
		Started: func(s *Server) { started = s },
		External: func() []nats.Option {
			t.Error("external options asked of the embedded server")
			return nil
		},
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	}, "main")
	require.NoError(t, err)
	t.Cleanup(l.Server.Shutdown)
	t.Cleanup(nc.Close)
	require.NotNil(t, l.Server)
	assert.Same(t, l.Server, started)
	assert.Equal(t, l.Server.ClientURL(), l.URL)

	other, err := l.Dial("other")
	require.NoError(t, err)
	t.Cleanup(other.Close)
	roundTrip(t, other, nc)
}

// With a URL the link starts nothing and dials the external server
// with the external options.
func TestOpenLinkExternal(t *testing.T) {
	srv, _ := startTestServer(t)
	asked := 0
	l, nc, err := OpenLink(LinkConfig{
		URL:      srv.ClientURL(),
		Embedded: func() Config { t.Error("embedded configuration asked with a URL"); return Config{} },
		External: func() []nats.Option { asked++; return srv.ClientOptions() },
		Logger:   slog.New(slog.DiscardHandler),
	}, "main")
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	assert.Nil(t, l.Server)
	assert.Equal(t, srv.ClientURL(), l.URL)
	other, err := l.Dial("other")
	require.NoError(t, err)
	t.Cleanup(other.Close)
	assert.Equal(t, 2, asked, "options asked at every dial")
	roundTrip(t, other, nc)
}

// An embedded server that cannot start is an error.
func TestOpenLinkEmbeddedFails(t *testing.T) {
	_, _, err := OpenLink(LinkConfig{
		Embedded: func() Config { return Config{Listen: "not an address", StoreDir: t.TempDir()} },
		Logger:   slog.New(slog.DiscardHandler),
	}, "main")
	assert.Error(t, err)
}
