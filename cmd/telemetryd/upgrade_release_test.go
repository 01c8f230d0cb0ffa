package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestUpgradeFromAnEarlierBuild starts today's service on a data dir
// written by an earlier build (testdata/release-509ecc7, made as its
// README says): one stream TELEMETRY, 20 readings a device stored and
// 30 more acked by the stream and never consumed. The service must
// hold all 50 once, in order, with the 10 published after it started
// (the first a retry of the last before), keep the attributes, and
// delete the old stream once drained. The earlier build's backup must
// restore with today's command.
func TestUpgradeFromAnEarlierBuild(t *testing.T) {
	inLane(t, lanes.general)
	dir := t.TempDir()
	untarGz(t, filepath.Join("testdata", "release-509ecc7", "datadir.tar.gz"), dir)
	devices := []string{"rf-a", "rf-b", "rf-c", "rf-d", "rf-e"}
	at := func(i int) string {
		return testEpoch.Add(-time.Hour + time.Duration(i)*time.Second).Format(time.RFC3339Nano)
	}
	fleetEast := map[string]string{"fleet": "East"}

	cfg := newTestConfig(t)
	cfg.DataDir = filepath.Join(dir, "data")
	s := startService(t, cfg)
	for i := 49; i < 60; i++ {
		for _, d := range devices {
			s.publish(t, d, fmt.Sprintf(`{"ts":%q,"v":%d}`, at(i), i))
		}
	}
	requireValuesInOrder(t, s, devices, 60)
	assert.Equal(t, fleetEast, deviceAttributes(t, s, "rf-a"))
	waitFor(t, 50*time.Millisecond, func() bool {
		_, err := s.js.Stream(context.Background(), "TELEMETRY")
		return errors.Is(err, jetstream.ErrStreamNotFound)
	}, "the earlier build's stream was not drained and deleted")
	assert.Len(t, readingStreams(t, s.js), DefaultStreamPartitions)

	restored, _ := restoreBackup(t, filepath.Join(dir, "backup"))
	cfg2 := newTestConfig(t)
	cfg2.DataDir = restored
	s2 := startService(t, cfg2)
	want := make([]string, 20)
	for i := range want {
		want[i] = at(i)
	}
	for _, d := range devices {
		requireEachOnce(t, s2, d, want)
	}
	assert.Equal(t, fleetEast, deviceAttributes(t, s2, "rf-a"))
}

// untarGz unpacks the gzipped tar file at path into dir, keeping
// file modes; an entry naming a path outside dir fails the test.
func untarGz(t *testing.T, path, dir string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	zr, err := gzip.NewReader(f)
	require.NoError(t, err)
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		require.NoError(t, err)
		name := filepath.Join(dir, filepath.FromSlash(h.Name))
		require.True(t, strings.HasPrefix(name, dir+string(filepath.Separator)), "entry %s leaves %s", h.Name, dir)
		switch h.Typeflag {
		case tar.TypeDir:
			require.NoError(t, os.MkdirAll(name, h.FileInfo().Mode().Perm()|0o700))
		case tar.TypeReg:
			require.NoError(t, os.MkdirAll(filepath.Dir(name), 0o755))
			out, err := os.OpenFile(name, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, h.FileInfo().Mode().Perm())
			require.NoError(t, err)
			_, err = io.Copy(out, tr)
			require.NoError(t, errors.Join(err, out.Close()))
		default:
			t.Fatalf("entry %s: type %c is not a file or a directory", h.Name, h.Typeflag)
		}
	}
}
