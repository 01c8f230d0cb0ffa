package natsembed

import (
	"errors"
	"io/fs"
	"path/filepath"
	"strings"
	"time"
)

// Outside sync-always the server fsyncs its message blocks on its own
// timer (SyncInterval). The store saves, every interval too, how far
// it has stored each stream, and that position must not reach the disk
// before the messages up to it: after a power cut the stream would end
// below the saved position and give the next messages the sequences of
// the lost ones, which a consumer started after the position skips.
// SyncStreams is the store's barrier (store.SetPositionBarrier): it
// fsyncs the message blocks written lately, and their directories, so
// every message the store was handed before it is on disk.

// streamSyncRecent is how far back a block's last write may be for
// SyncStreams to sync it: older ones went through the server's own
// syncs long ago.
const streamSyncRecent = 2 * time.Minute

// SyncStreams fsyncs the message blocks of every stream written in the
// last two minutes, and the directories holding them. With sync-always
// (every message fsynced before its ack) it does nothing. Safe to call
// from any goroutine.
func (s *Server) SyncStreams() error {
	if s.cfg.SyncAlways || s.jsConfig.StoreDir == "" {
		return nil
	}
	return syncBlocks(s.jsConfig.StoreDir, time.Now().Add(-streamSyncRecent), syncPath)
}

// syncBlocks fsyncs, under dir, every message block (msgs/*.blk)
// modified after since, then each msgs directory holding one. Files
// removed meanwhile are skipped; the first error is returned after the
// pass.
func syncBlocks(dir string, since time.Time, sync func(string) error) error {
	dirs := map[string]bool{}
	var first error
	note := func(err error) {
		if err != nil && first == nil && !errors.Is(err, fs.ErrNotExist) {
			first = err
		}
	}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if d.IsDir() || !strings.HasSuffix(d.Name(), ".blk") || filepath.Base(filepath.Dir(path)) != "msgs" {
			return nil
		}
		info, err := d.Info()
		if err != nil || info.ModTime().Before(since) {
			return nil // removed since the walk listed it, or long synced
		}
		if err := sync(path); err != nil {
			note(err)
			return nil
		}
		dirs[filepath.Dir(path)] = true
		return nil
	})
	for d := range dirs {
		note(sync(d))
	}
	note(err)
	return first
}
