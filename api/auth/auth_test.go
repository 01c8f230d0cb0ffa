package auth_test

import (
	"context"
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

var h1 = auth.HashSecret("one-0123456789abcdef")

func TestParseValid(t *testing.T) {
	f, err := auth.Parse([]byte(`{"devices":[{"id":"dev-1","secret":"` + h1 + `"}],
	  "tokens":[{"name":"grafana","secret":"` + auth.HashSecret("two-0123456789") + `","scopes":["read"],"devices":["sim-*"]}]}`))
	require.NoError(t, err)
	set := auth.Compile(f)
	assert.True(t, set.Device("dev-1", "one-0123456789abcdef"))
	assert.False(t, set.Device("dev-1", "one-0123456789abcdeX"), "wrong secret")
	assert.False(t, set.Device("dev-2", "one-0123456789abcdef"), "unknown device")
	p, ok := set.Token("two-0123456789")
	require.True(t, ok)
	assert.Equal(t, "grafana", p.Name)
	assert.True(t, p.Has(auth.ScopeRead))
	assert.False(t, p.Has(auth.ScopeAdmin))
	assert.True(t, p.DeviceVisible("sim-17"))
	assert.False(t, p.DeviceVisible("dev-1"))
	_, ok = set.Token(h1)
	assert.False(t, ok, "the stored hash is not a credential")
}

func TestParseRejects(t *testing.T) {
	good := `"secret":"` + h1 + `"`
	tests := map[string]struct{ file, want string }{
		"plain secret":     {`{"devices":[{"id":"d","secret":"hunter2"}]}`, `devices[0] ("d"): secret must be "sha256:`},
		"short hash":       {`{"devices":[{"id":"d","secret":"sha256:abcd"}]}`, "has 4 hex digits"},
		"bad device id":    {`{"devices":[{"id":"a.b",` + good + `}]}`, `devices[0] ("a.b"): id`},
		"duplicate device": {`{"devices":[{"id":"d",` + good + `},{"id":"d","secret":"` + auth.HashSecret("x") + `"}]}`, "id appears twice"},
		"shared secret":    {`{"devices":[{"id":"d",` + good + `},{"id":"e",` + good + `}]}`, "same secret"},
		"unknown scope":    {`{"tokens":[{"name":"t",` + good + `,"scopes":["root"]}]}`, `scope "root"`},
		"no scopes":        {`{"tokens":[{"name":"t",` + good + `}]}`, "at least one"},
		"bad glob":         {`{"tokens":[{"name":"t",` + good + `,"scopes":["read"],"devices":["sim-["]}]}`, "not a valid glob"},
		"bad name":         {`{"tokens":[{"name":"a b",` + good + `,"scopes":["read"]}]}`, "name must match"},
		"unknown field":    {`{"devices":[],"token":[]}`, "unknown field"},
		"trailing data":    {`{} {}`, "after the JSON object"},
		"not json":         {`devices: []`, "auth file"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			_, err := auth.Parse([]byte(tt.file))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tt.want)
		})
	}
	t.Run("too large", func(t *testing.T) {
		_, err := auth.Parse(make([]byte, auth.MaxFileBytes+1))
		require.ErrorContains(t, err, "more than the limit")
	})
}

func TestNewSecretIsRandomAndLong(t *testing.T) {
	a, err := auth.NewSecret()
	require.NoError(t, err)
	b, err := auth.NewSecret()
	require.NoError(t, err)
	assert.NotEqual(t, a, b)
	assert.GreaterOrEqual(t, len(a), 43, "256 bits in base64url")
}

func writeFile(t *testing.T, path string, f *auth.File) {
	t.Helper()
	require.NoError(t, auth.Save(path, f))
}

func TestSaveIsPrivate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	writeFile(t, path, &auth.File{Devices: []auth.Device{{ID: "d", Secret: h1}}})
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o600), st.Mode().Perm())
	f, err := auth.Load(path)
	require.NoError(t, err)
	assert.Equal(t, "d", f.Devices[0].ID)
}

// TestSaveCreatesDirectory: the first `telemetryd auth add-device` with
// -auth-file /etc/telemetryd/auth.json works on a host without that
// directory, which it makes private.
func TestSaveCreatesDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "etc", "telemetryd")
	path := filepath.Join(dir, "auth.json")
	writeFile(t, path, &auth.File{Devices: []auth.Device{{ID: "d", Secret: h1}}})
	st, err := os.Stat(dir)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	f, err := auth.Load(path)
	require.NoError(t, err)
	assert.Equal(t, "d", f.Devices[0].ID)
}

// TestStoreReloadRace reloads while readers check credentials; run
// with -race.
func TestStoreReloadRace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	secret := func(i int) string { return "secret-of-device-" + strings.Repeat("x", i%3) + "0123456789" }
	file := func(n int) *auth.File {
		f := &auth.File{}
		for i := range n {
			f.Devices = append(f.Devices, auth.Device{ID: "dev-" + string(rune('a'+i)), Secret: auth.HashSecret(secret(i) + string(rune('a'+i)))})
		}
		return f
	}
	writeFile(t, path, file(2))
	st, err := auth.Open(path, nil)
	require.NoError(t, err)
	var changes sync.Map
	st.OnChange(func(s *auth.Set) { changes.Store(s, true) })
	assert.True(t, st.Device("dev-a", secret(0)+"a"))
	assert.False(t, st.Device("dev-c", secret(2)+"c"))

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go st.Watch(ctx, 5*time.Millisecond)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				st.Device("dev-a", secret(0)+"a")
				st.Token("nothing")
			}
		})
	}
	writeFile(t, path, file(3))
	require.Eventually(t, func() bool { return st.Device("dev-c", secret(2)+"c") }, 5*time.Second, 5*time.Millisecond,
		"a device added to the file is accepted after the poll")
	changed, err := st.Reload()
	require.NoError(t, err)
	assert.False(t, changed, "an unchanged file is not reloaded")

	require.NoError(t, os.WriteFile(path, []byte(`{"devices":[{"id":"x","secret":"plain"}]}`), 0o600))
	_, err = st.Reload()
	require.Error(t, err, "SIGHUP with a broken file")
	assert.True(t, st.Device("dev-c", secret(2)+"c"), "a broken file leaves the previous credentials in force")

	cancel() // the watcher would race the explicit reload below
	wg.Wait()
	writeFile(t, path, file(1))
	changed, err = st.Reload()
	require.NoError(t, err)
	assert.True(t, changed)
	assert.False(t, st.Device("dev-b", secret(1)+"b"), "a removed device is refused")
}

func TestOpenRefusesBrokenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auth.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"tokens":[{"name":"t","secret":"sha256:zz"}]}`), 0o600))
	_, err := auth.Open(path, nil)
	require.ErrorContains(t, err, path)
	_, err = auth.Open(filepath.Join(t.TempDir(), "missing.json"), nil)
	require.ErrorContains(t, err, "no such file")
}

func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"devices":[{"id":"dev-1","secret":"` + h1 + `"}],"tokens":[{"name":"g","secret":"` +
		auth.HashSecret("g") + `","scopes":["read","admin"],"devices":["sim-*","[a-c]?"]}]}`))
	f.Add([]byte(`{"tokens":[{"name":"t","secret":"sha256:","scopes":[]}]}`))
	f.Add([]byte(`{"devices":null,"tokens":null}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := auth.Parse(data)
		if err != nil {
			return
		}
		require.NoError(t, file.Validate(), "a parsed file validates")
		set := auth.Compile(file)
		for _, d := range file.Devices {
			require.True(t, set.HasDevice(d.ID))
			require.False(t, set.Device(d.ID, d.Secret), "the stored hash is not the secret")
		}
		for _, tk := range file.Tokens {
			for _, p := range tk.Devices {
				require.NoError(t, auth.ValidatePattern(p))
			}
		}
		path := filepath.Join(t.TempDir(), "auth.json")
		require.NoError(t, auth.Save(path, file))
		again, err := auth.Load(path)
		require.NoError(t, err, "a saved file loads")
		require.Equal(t, len(file.Devices), len(again.Devices))
		require.Equal(t, len(file.Tokens), len(again.Tokens))
	})
}
