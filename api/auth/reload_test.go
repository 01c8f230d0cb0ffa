package auth_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/auth"
)

// syncBuffer is a log sink safe for the watcher and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestReloadReturnsItsErrorAndLogsNothing: Reload hands a refused file's
// error to its caller without logging it; Watch, a caller, logs the
// refused content once however many polls see it.
func TestReloadReturnsItsErrorAndLogsNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	writeFile(t, path, &auth.File{Devices: []auth.Device{{ID: "dev-1", Secret: h1}}})
	var logs syncBuffer
	st, err := auth.Open(path, slog.New(slog.NewTextHandler(&logs, nil)))
	require.NoError(t, err)

	require.NoError(t, os.WriteFile(path, []byte(`{"devices":[{"id":"x","secret":"plain"}]}`), 0o600))
	_, err = st.Reload()
	require.ErrorContains(t, err, path)
	_, err = st.Reload()
	require.ErrorIs(t, err, auth.ErrStillRefused)
	require.ErrorContains(t, err, path, "the second refusal still says why")
	assert.Empty(t, logs.String(), "Reload logs nothing")

	require.NoError(t, os.WriteFile(path, []byte(`{"devices":[{"id":"y","secret":"plain"}]}`), 0o600))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); st.Watch(ctx, time.Millisecond) }()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "auth file not reloaded") },
		5*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond) // several more polls of the same content
	cancel()
	<-done
	assert.Equal(t, 1, strings.Count(logs.String(), "auth file not reloaded"), logs.String())
	assert.Contains(t, logs.String(), "err=")
}
