package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// flipBlockBit flips one bit in the middle of the value of the block
// of dev, in the day table of day under dataDir, whose key is the
// n-th of the device's keys (newest first), writing it back directly
// in Badger as a damaged disk would leave it. It returns the key.
func flipBlockBit(t *testing.T, dataDir string, day buckets.Day, dev string, n int) []byte {
	t.Helper()
	db, err := badger.OpenManaged(store.TableBadgerOptions(store.TableDir(dataDir, day), true, false, slog.New(slog.NewTextHandler(io.Discard, nil))))
	require.NoError(t, err)
	defer func() { require.NoError(t, db.Close()) }()
	var key, value []byte
	var meta byte
	txn := db.NewTransactionAt(db.MaxVersion(), false)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: []byte(dev + "/")})
	i := 0
	for it.Rewind(); it.Valid() && key == nil; it.Next() {
		if i == n {
			key, meta = it.Item().KeyCopy(nil), it.Item().UserMeta()
			value, err = it.Item().ValueCopy(nil)
			require.NoError(t, err)
		}
		i++
	}
	it.Close()
	txn.Discard()
	require.NotNil(t, key, "device %s has no block %d", dev, n)
	value[len(value)/2] ^= 0x04
	w := db.NewTransactionAt(db.MaxVersion(), true)
	defer w.Discard()
	require.NoError(t, w.SetEntry(badger.NewEntry(key, value).WithMeta(meta)))
	require.NoError(t, w.CommitAt(db.MaxVersion()+1, nil))
	return key
}

// answer fetches path with q and returns the status, the decoded JSON
// body and the Telemetry-Warning header lines.
func answer(t *testing.T, s *testService, path string, q url.Values) (int, map[string]any, []string) {
	t.Helper()
	resp, err := http.Get(s.base + path + "?" + q.Encode())
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out map[string]any
	require.NoError(t, json.Unmarshal(body, &out), "body %s", body)
	return resp.StatusCode, out, resp.Header.Values("Telemetry-Warning")
}

// TestCorruptBlockThroughTheService flips one bit of one stored block
// of a stopped service: `telemetryd check` names the block and exits 1;
// the service, started again, answers every query with the other
// blocks' readings and a warning naming the block, and counts it.
func TestCorruptBlockThroughTheService(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	const dev = "dev-c"
	start := testEpoch.Add(-4 * time.Hour)
	for h := range 3 { // the readings of each hour end in a block of their own
		for i := range 4 {
			at := start.Add(time.Duration(h)*time.Hour + time.Duration(i)*time.Minute)
			s.publish(t, dev, fmt.Sprintf(`{"ts":%q,"values":{"temp":%d}}`, at.Format(time.RFC3339), 10*h+i))
		}
	}
	waitStored(t, s, dev, 12)
	s.stop(t)

	day := buckets.DayOf(buckets.MustTicks(start))
	key := flipBlockBit(t, cfg.DataDir, day, dev, 1) // the middle hour
	keyHex := hex.EncodeToString(key)

	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"check", "-data-dir", cfg.DataDir}, envMap(nil), &stdout, &stderr)
	assert.Equal(t, 1, code, "stdout %s\nstderr %s", stdout.String(), stderr.String())
	out := stdout.String()
	assert.Contains(t, out, "corrupt block: day "+day.String()+" device "+dev+" key "+keyHex)
	assert.Contains(t, out, "checksum mismatch")
	assert.Contains(t, out, "1 corrupt blocks")

	s = startService(t, cfg)
	from, to := start.Add(-time.Minute).Format(time.RFC3339), testEpoch.Format(time.RFC3339)
	checkAnswer := func(t *testing.T, code int, body map[string]any, header []string) {
		t.Helper()
		require.Equal(t, http.StatusOK, code, "%v", body)
		require.NotEmpty(t, header)
		assert.Contains(t, header[0], keyHex)
		ws, _ := body["warnings"].([]any)
		require.Len(t, ws, 1, "%v", body)
		assert.Contains(t, ws[0], keyHex)
		assert.Contains(t, ws[0], day.String())
		assert.Contains(t, ws[0], dev)
	}
	t.Run("latest and range", func(t *testing.T) {
		for _, path := range []string{"/v1/devices/" + dev + "/readings/latest", "/v1/devices/" + dev + "/readings"} {
			code, body, header := answer(t, s, path, url.Values{"limit": {"100"}, "from": {from}, "to": {to}})
			if strings.HasSuffix(path, "latest") {
				code, body, header = answer(t, s, path, url.Values{"limit": {"100"}})
			}
			checkAnswer(t, code, body, header)
			rs, _ := body["readings"].([]any)
			assert.Len(t, rs, 8, "%s: the readings of the other two hours", path)
		}
	})
	t.Run("aggregates", func(t *testing.T) {
		code, body, header := answer(t, s, "/v1/devices/"+dev+"/aggregates", url.Values{"from": {from}, "to": {to}, "interval": {"1h"}})
		checkAnswer(t, code, body, header)
		assert.Contains(t, fmt.Sprint(body["buckets"]), "count:4")
		assert.NotContains(t, fmt.Sprint(body["buckets"]), "sum:46") // 10+11+12+13: the corrupt hour
	})
	t.Run("promql", func(t *testing.T) {
		for _, query := range []string{`temp{device="dev-c"}`, `count_over_time(temp{device="dev-c"}[1h])`} {
			q := url.Values{"query": {query}, "start": {from}, "end": {to}, "step": {"60"}}
			code, body, header := answer(t, s, "/api/v1/query_range", q)
			checkAnswer(t, code, body, header)
		}
	})
	v, ok := sample(scrape(t, s), "telemetry_store_corrupt_blocks_total", map[string]string{"kind": "block"})
	require.True(t, ok, "the metric is exported")
	assert.Equal(t, float64(1), v)
}

func TestCheckCleanDataDirAndRunningService(t *testing.T) {
	inLane(t, lanes.general)
	cfg := newTestConfig(t)
	s := startService(t, cfg)
	s.publish(t, "dev-ok", fmt.Sprintf(`{"ts":%q,"values":{"temp":1}}`, testEpoch.Add(-time.Hour).Format(time.RFC3339)))
	waitStored(t, s, "dev-ok", 1)

	var stdout, stderr bytes.Buffer
	assert.Equal(t, 1, run(context.Background(), []string{"check", "-data-dir", cfg.DataDir}, envMap(nil), &stdout, &stderr))
	assert.Contains(t, stderr.String(), "in use by a running telemetryd")
	s.stop(t)

	stdout.Reset()
	stderr.Reset()
	code := run(context.Background(), []string{"check"}, envMap(map[string]string{"TELEMETRY_DATA_DIR": cfg.DataDir}), &stdout, &stderr)
	assert.Equal(t, 0, code, "stdout %s\nstderr %s", stdout.String(), stderr.String())
	assert.Contains(t, stdout.String(), "checked 1 tables, 1 blocks, 1 device index records: 0 corrupt blocks, 0 corrupt records, 0 unreadable tables")

	assert.Equal(t, 2, run(context.Background(), []string{"check", "-http-addr", ":1"}, envMap(nil), &stdout, &stderr), "a service flag is refused")
}
