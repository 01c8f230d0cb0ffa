package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
)

// backupAcked is what a publisher got acked: device -> reading times.
type backupAcked struct {
	mu sync.Mutex
	ts map[string][]string
	n  int
}

func (a *backupAcked) count() int { a.mu.Lock(); defer a.mu.Unlock(); return a.n }

// publishUntil publishes messages of perMsg readings to devices
// round-robin until stop is closed, recording every acked reading.
func publishUntil(t *testing.T, js jetstream.JetStream, devices []string, stop <-chan struct{}) (*backupAcked, <-chan struct{}) {
	const perMsg = 5
	log := &backupAcked{ts: map[string][]string{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			dev := devices[i%len(devices)]
			base := testEpoch.Add(-time.Hour + time.Duration(i)*10*time.Millisecond)
			var ts, parts []string
			for j := range perMsg {
				s := base.Add(time.Duration(j) * time.Millisecond).Format(time.RFC3339Nano)
				ts = append(ts, s)
				parts = append(parts, fmt.Sprintf(`{"ts":%q,"v":%d}`, s, i*perMsg+j))
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := js.Publish(ctx, "telemetry."+dev, []byte("["+strings.Join(parts, ",")+"]"))
			cancel()
			if err != nil {
				t.Errorf("publish %d: %v", i, err)
				return
			}
			log.mu.Lock()
			log.ts[dev] = append(log.ts[dev], ts...)
			log.n++
			log.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}()
	return log, done
}

// onlineBackup is a backup taken through POST /v1/backup while
// readings flowed through an external NATS server's one stream
// TELEMETRY, with more readings acked after it.
type onlineBackup struct {
	ns    *server.Server
	js    jetstream.JetStream // a client of ns
	cfg   Config              // the service's, which has stopped
	acked *backupAcked        // every reading acked, before and after the backup
	dir   string
	seq   uint64 // the backup's position in TELEMETRY
}

// backupWhilePublishing starts a service on an external NATS server,
// publishes to devices round-robin, takes an online backup into
// <backup-dir>/name once 300 messages are acked and a stream position
// saved, goes on until 300 more are acked, then stops publisher and
// service.
func backupWhilePublishing(t *testing.T, name string, devices []string) onlineBackup {
	t.Helper()
	ns := runNATS(t, -1, t.TempDir())
	t.Cleanup(ns.Shutdown)
	cfg := newTestConfig(t)
	cfg.NATSURL = ns.ClientURL() // with -nats-url the one stream TELEMETRY
	root := t.TempDir()
	cfg.BackupDir = root
	s := startService(t, cfg)

	pc, err := nats.Connect(ns.ClientURL())
	require.NoError(t, err)
	t.Cleanup(pc.Close)
	js, err := jetstream.New(pc)
	require.NoError(t, err)
	stop := make(chan struct{})
	acked, pubDone := publishUntil(t, js, devices, stop)
	waitFor(t, 10*time.Millisecond, func() bool { return acked.count() > 300 })
	time.Sleep(1500 * time.Millisecond) // a stream position is saved every second

	dir := filepath.Join(root, name)
	body, _ := json.Marshal(api.BackupRequest{Dir: dir})
	code, out := s.post(t, "/v1/backup", body, map[string]string{"Content-Type": "application/json"})
	require.Equal(t, http.StatusOK, code, out)
	var sum api.BackupSummary
	require.NoError(t, json.Unmarshal([]byte(out), &sum))
	seq := sum.Positions["TELEMETRY"]
	require.NotZero(t, seq, "the backup records the stream position: %s", out)

	n := acked.count()
	waitFor(t, 10*time.Millisecond, func() bool { return acked.count() > n+300 })
	close(stop)
	<-pubDone
	s.stop(t)
	return onlineBackup{ns: ns, js: js, cfg: cfg, acked: acked, dir: dir, seq: seq}
}

// restoreBackup runs `telemetryd restore` from dir into a new data dir,
// which it returns with the command's output.
func restoreBackup(t *testing.T, dir string) (dataDir, stdout string) {
	t.Helper()
	dataDir = filepath.Join(t.TempDir(), "restored")
	var out, stderr bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"restore", "-from", dir, "-data-dir", dataDir},
		func(string) string { return "" }, &out, &stderr), stderr.String())
	return dataDir, out.String()
}

// requireEachOnce waits until s holds at least len(want) readings of
// device in the hour before testEpoch, then asserts that it holds each
// reading time of want exactly once and nothing else.
func requireEachOnce(t *testing.T, s *testService, device string, want []string) {
	t.Helper()
	require.NotEmpty(t, want)
	q := url.Values{"from": {testEpoch.Add(-2 * time.Hour).Format(time.RFC3339Nano)}, "to": {testEpoch.Format(time.RFC3339Nano)}}
	var got []apiReading
	waitFor(t, 50*time.Millisecond, func() bool {
		got = pageAll(t, s, device, "asc", 10000, q)
		return len(got) >= len(want)
	}, "device %s: %d of %d readings", device, len(got), len(want))
	seen := map[string]int{}
	for _, r := range got {
		seen[r.TS]++
	}
	missing, twice := 0, 0
	for _, ts := range want {
		switch seen[ts] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	assert.Zero(t, missing, "device %s: acked readings lost", device)
	assert.Zero(t, twice, "device %s: readings stored twice", device)
	assert.Len(t, got, len(want), "device %s", device)
}

// An online backup taken while readings flow, restored into a fresh
// data dir, and a service started on it against the same stream: every
// acked reading is stored exactly once, those published after the
// backup included (the consumer resumes after the backup's positions).
func TestOnlineBackupRestoreKeepsEveryAckedReading(t *testing.T) {
	inLane(t, lanes.general)
	devices := []string{"bk-a", "bk-b", "bk-c"}
	b := backupWhilePublishing(t, "nightly", devices)
	stream, err := b.js.Stream(context.Background(), "TELEMETRY")
	require.NoError(t, err)
	info, err := stream.Info(context.Background())
	require.NoError(t, err)
	require.Greater(t, info.State.LastSeq, b.seq+100, "messages after the backup must come from the stream")

	dataDir, out := restoreBackup(t, b.dir)
	assert.Contains(t, out, fmt.Sprintf("TELEMETRY after %d", b.seq))
	assert.Contains(t, out, "[1/")

	cfg2 := b.cfg
	cfg2.DataDir = dataDir
	s2 := startService(t, cfg2)
	t.Cleanup(func() { s2.stop(t) })
	waitFor(t, 50*time.Millisecond, func() bool {
		c, err := b.js.Consumer(context.Background(), "TELEMETRY", "ingest")
		if err != nil {
			return false
		}
		ci, err := c.Info(context.Background())
		return err == nil && ci.NumPending == 0 && ci.NumAckPending == 0 && ci.Config.OptStartSeq == b.seq+1
	}, "the consumer did not resume after the backup's position")
	for _, d := range devices {
		requireEachOnce(t, s2, d, b.acked.ts[d])
	}
}

// POST /v1/backup writes only under -backup-dir.
func TestOnlineBackupStaysUnderTheRoot(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	root := t.TempDir()
	cfg.BackupDir = root
	s := startService(t, cfg)
	t.Cleanup(func() { s.stop(t) })
	outside := t.TempDir()
	require.NoError(t, os.Symlink(outside, filepath.Join(root, "link")))
	for _, dir := range []string{outside, root, filepath.Join(root, "link"), filepath.Join(root, "link", "deeper")} {
		body, _ := json.Marshal(api.BackupRequest{Dir: dir})
		code, out := s.post(t, "/v1/backup", body, map[string]string{"Content-Type": "application/json"})
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", dir, out)
		assert.Contains(t, out, "outside the backup root", dir)
	}
	entries, err := os.ReadDir(outside)
	require.NoError(t, err)
	assert.Empty(t, entries, "nothing written outside the root")

	body, _ := json.Marshal(api.BackupRequest{Dir: filepath.Join(root, "ok", "nested")})
	code, out := s.post(t, "/v1/backup", body, map[string]string{"Content-Type": "application/json"})
	require.Equal(t, http.StatusOK, code, out)
	_, err = os.Stat(filepath.Join(root, "ok", "nested", "MANIFEST.json"))
	assert.NoError(t, err)
}

// The offline command refuses a data dir in use and points to the
// online way; restore refuses a corrupt backup naming the file.
func TestBackupCommandOfflineAndRestoreChecks(t *testing.T) {
	inLane(t, lanes.general)
	ctx := context.Background()
	env := func(string) string { return "" }
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	s.publish(t, "cli-a", fmt.Sprintf(`{"ts":%q,"v":1}`, testEpoch.Add(-time.Minute).Format(time.RFC3339Nano)))
	waitFor(t, 20*time.Millisecond, func() bool {
		code, _ := s.get(t, "/v1/devices/cli-a", nil)
		return code == http.StatusOK
	})

	bdir := t.TempDir()
	var stdout, stderr bytes.Buffer
	assert.Equal(t, 1, run(ctx, []string{"backup", "-data-dir", cfg.DataDir, "-to", bdir}, env, &stdout, &stderr))
	assert.Contains(t, stderr.String(), "in use by a running telemetryd")
	assert.Contains(t, stderr.String(), "-url")
	s.stop(t)

	stdout.Reset()
	stderr.Reset()
	require.Equal(t, 0, run(ctx, []string{"backup", "-data-dir", cfg.DataDir, "-to", bdir}, env, &stdout, &stderr), stderr.String())
	assert.Contains(t, stdout.String(), "backup 1 in "+bdir)

	var m struct {
		Tables []struct {
			Files []struct{ Path string } `json:"files"`
		} `json:"tables"`
	}
	b, err := os.ReadFile(filepath.Join(bdir, "MANIFEST.json"))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(b, &m))
	require.NotEmpty(t, m.Tables, "stdout %s stderr %s manifest %s", stdout.String(), stderr.String(), b)
	path := filepath.Join(bdir, m.Tables[0].Files[0].Path)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	data[len(data)-1] ^= 1
	require.NoError(t, os.WriteFile(path, data, 0o644))

	stderr.Reset()
	dataDir := filepath.Join(t.TempDir(), "d")
	assert.Equal(t, 1, run(ctx, []string{"restore", "-from", bdir, "-data-dir", dataDir}, env, &stdout, &stderr))
	assert.Contains(t, stderr.String(), path)
	_, err = os.Stat(dataDir)
	assert.True(t, os.IsNotExist(err), "nothing restored from a corrupt backup")
}

// Without -backup-dir, online backups go under <data-dir>-backups, as the
// README's example writes them; -backup-dir off answers 501 naming the
// flag that turns them on.
func TestOnlineBackupDefaultDirAndOff(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	cfg.DataDir = filepath.Join(t.TempDir(), "data")
	s := startService(t, cfg)
	root := cfg.DataDir + "-backups"
	json := map[string]string{"Content-Type": "application/json"}
	code, out := s.post(t, "/v1/backup", []byte(`{"dir":"`+filepath.Join(root, "nightly")+`"}`), json)
	require.Equal(t, http.StatusOK, code, out)
	_, err := os.Stat(filepath.Join(root, "nightly", "MANIFEST.json"))
	assert.NoError(t, err, "the backup is under <data-dir>-backups")
	code, out = s.post(t, "/v1/backup", []byte(`{"dir":"`+filepath.Join(filepath.Dir(root), "elsewhere")+`"}`), json)
	assert.Equal(t, http.StatusBadRequest, code, out)
	s.stop(t)

	cfg.BackupDir = "off"
	s = startService(t, cfg)
	t.Cleanup(func() { s.stop(t) })
	code, out = s.post(t, "/v1/backup", []byte(`{"dir":"`+filepath.Join(root, "again")+`"}`), json)
	assert.Equal(t, http.StatusNotImplemented, code, out)
	assert.JSONEq(t, `{"error":{"code":"not_implemented","message":"path: online backups are off on this instance (-backup-dir off): start telemetryd with -backup-dir DIR, or take the backup from the stopped data dir with telemetryd backup -data-dir"}}`, out)
	_, err = os.Stat(filepath.Join(root, "again"))
	assert.True(t, os.IsNotExist(err), "nothing written when backups are off")
}
