package natsembed

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// Outside sync-always, nats-server writes a stream's and a consumer's
// metadata (meta.inf, meta.sum, a consumer's o.dat) without fsync and
// syncs only the message blocks on its interval. After a power cut an
// empty meta.sum makes the server skip the stream at start: the service
// creates it again over the same message blocks, and the new consumer
// starts from the stream's beginning, so what a power cut then loses is
// no longer bounded by the sync interval. The embedded server's owner
// closes that gap: every SyncInterval it fsyncs the metadata files
// that changed, and the directories that hold them.

// metaFiles are the names of the metadata files syncMetadata fsyncs.
var metaFiles = map[string]bool{"meta.inf": true, "meta.sum": true, "meta.key": true, "o.dat": true}

// metaSyncer fsyncs the JetStream metadata under dir.
type metaSyncer struct {
	dir  string
	sync func(path string) error // syncPath; tests record the calls
}

// pass fsyncs every metadata file, then the directories holding them.
// It syncs them all, changed or not: the server replaces a file by
// writing a temporary one and renaming it over, and a modification time
// cannot tell two such writes in one tick of the file system's clock
// apart (a FUSE file system may keep whole seconds), so a file skipped
// as unchanged could be a new one never synced. An fsync of a file with
// nothing unwritten costs little. Files removed meanwhile are skipped;
// the first error is returned after the pass.
func (m *metaSyncer) pass() error {
	sync := m.sync
	if sync == nil {
		sync = syncPath
	}
	dirs := map[string]bool{}
	var first error
	err := filepath.WalkDir(m.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() {
			if d.Name() == "msgs" {
				return filepath.SkipDir // message blocks: the server syncs them
			}
			return nil
		}
		if !metaFiles[d.Name()] {
			return nil
		}
		if err := sync(path); err != nil {
			if first == nil && !errors.Is(err, fs.ErrNotExist) {
				first = err
			}
			return nil
		}
		dirs[filepath.Dir(path)] = true
		return nil
	})
	for dir := range dirs {
		if err := sync(dir); err != nil && first == nil && !errors.Is(err, fs.ErrNotExist) {
			first = err
		}
	}
	if err != nil && first == nil {
		first = err
	}
	return first
}

// syncPath fsyncs a file or directory.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	serr := f.Sync()
	cerr := f.Close()
	return errors.Join(serr, cerr)
}

// syncMetadata runs a pass every interval until stop is closed.
func (s *Server) syncMetadata(stop <-chan struct{}, interval time.Duration) {
	m := &metaSyncer{dir: s.jsConfig.StoreDir}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	failing := false
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		err := m.pass()
		switch {
		case err != nil && !failing:
			s.log.Warn("fsync of the stream metadata failed; a power cut may make the server skip a stream at start", "dir", m.dir, "err", err)
		case err == nil && failing:
			s.log.Info("fsync of the stream metadata works again", "dir", m.dir)
		}
		failing = err != nil
	}
}
