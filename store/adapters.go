package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/atomicfile"
	"github.com/telemetryd/telemetryd/store/backup"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/block"
	"github.com/telemetryd/telemetryd/store/repair"
	"github.com/telemetryd/telemetryd/store/replay"
	"github.com/telemetryd/telemetryd/store/rollup"
	"github.com/telemetryd/telemetryd/store/storemetrics"
)

// This file is the store's side of the packages that do a job on its
// databases from outside: what they declare they need, implemented
// over the store's tables, index and rollups.

// restoredFileName in a data directory says that Restore made it and
// no service has resumed the stream on it yet (Restored).
const restoredFileName = "RESTORED"

// Backup copies every day table, the device index and every rollup
// period database into dir (package backup, Run), incrementally
// against the newest backup already in dir unless opts.Full. It works
// on an open store while it is being written, and on a read-only one
// (a stopped data dir).
func (s *Store) Backup(ctx context.Context, dir string, opts backup.Options) (backup.Manifest, error) {
	if opts.Logger == nil {
		opts.Logger = s.log
	}
	m, err := backup.Run(ctx, backupSource{s}, dir, opts)
	if err != nil {
		s.metrics.Backups.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(storemetrics.OutcomeFailed))
		return backup.Manifest{}, err
	}
	s.metrics.Backups.Add(ctx, 1, metric.WithAttributes(storemetrics.OutcomeOK))
	s.metrics.BackupBytes.Add(ctx, m.CopiedBytes)
	s.lastBackup.Store(time.Now().Unix())
	return m, nil
}

// backupSource is the store as a backup copies it.
type backupSource struct{ s *Store }

var _ backup.Source = backupSource{}

// Positions reads the saved stream positions, after a sync has written
// the pending ones (syncloop.go): their readings are committed, so the
// tables copied next hold them.
func (src backupSource) Positions() (map[string]backup.Position, error) {
	s := src.s
	if !s.opts.SyncWrites {
		s.syncAll()
	}
	pos, err := s.replay.Written()
	if err != nil {
		return nil, err
	}
	out := make(map[string]backup.Position, len(pos))
	for name, p := range pos {
		out[name] = backup.Position{Created: time.Unix(0, p.Created).UTC(), Seq: p.Seq}
	}
	return out, nil
}

// Index saves the device index's pending updates, so it holds every
// device the copied positions vouch for, and returns its database.
func (src backupSource) Index() (*badger.DB, error) {
	idx := src.s.index
	if !src.s.opts.ReadOnly {
		if err := idx.Flush(); err != nil {
			return nil, err
		}
	}
	return idx.DB(), nil
}

// Days lists every day table, oldest first.
func (src backupSource) Days() []buckets.Day {
	return src.s.daysBetween(0, buckets.Day(1<<31-1), buckets.Asc)
}

// Table holds the table of day at the version of its last completed
// commit, which it keeps readable (compaction drops nothing a reader at
// it sees) while fn copies it. A Badger panic in fn (damaged data)
// becomes an error naming the day (guard).
func (src backupSource) Table(ctx context.Context, day buckets.Day, fn func(db *badger.DB, dir string, at uint64) error) error {
	s := src.s
	t, err := s.acquire(ctx, day, forRead)
	if err != nil {
		return err
	}
	if t == nil { // dropped meanwhile
		return nil
	}
	defer s.release(t)
	txn, unpin := t.ver.ReadTxn(t.db)
	defer unpin()
	at := txn.ReadTs()
	return s.guard(t, func() error { return fn(t.db, t.dir, at) })
}

// Rollups lists the rollup periods to back up and views one:
// through the open rollups, or, in a read-only store (whose rollups are
// not open), each database opened read-only from the disk.
func (src backupSource) Rollups() (names []string, view func(name string, fn func(dir string, db *badger.DB) error) (bool, error), err error) {
	s := src.s
	if s.rollupsOn() {
		byName := map[string]rollup.Period{}
		for _, p := range s.rollups.set.Periods() {
			n := rollup.PeriodName(p)
			byName[n] = p
			names = append(names, n)
		}
		return names, func(name string, fn func(string, *badger.DB) error) (bool, error) {
			return s.rollups.set.View(byName[name], fn)
		}, nil
	}
	if !s.opts.ReadOnly {
		return nil, nil, nil
	}
	root := filepath.Join(s.dir, rollupsDirName)
	levels, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("rollups: %w", err)
	}
	for _, l := range levels {
		if !l.IsDir() {
			continue
		}
		months, err := os.ReadDir(filepath.Join(root, l.Name()))
		if err != nil {
			return nil, nil, fmt.Errorf("rollups: %w", err)
		}
		for _, m := range months {
			n := l.Name() + "/" + m.Name()
			if _, _, err := rollup.ParsePeriodName(n); err == nil && m.IsDir() {
				names = append(names, n) // not a period being dropped (.drop-)
			}
		}
	}
	return names, func(name string, fn func(string, *badger.DB) error) (bool, error) {
		dir := filepath.Join(root, filepath.FromSlash(name))
		db, err := badgeropts.OpenView(badgeropts.Rollup(dir, false, true, s.log), badgeropts.Open)
		if err != nil {
			return false, fmt.Errorf("open rollup %s: %w", name, err)
		}
		err = fn(dir, db)
		err = errors.Join(err, db.Close())
		badgeropts.ReleaseView(db)
		return true, err
	}, nil
}

// Tombstones lists the dropped days with when.
func (src backupSource) Tombstones() map[string]time.Time {
	out := map[string]time.Time{}
	for _, t := range src.s.Tombstones() {
		out[t.Day.String()] = t.Dropped.UTC()
	}
	return out
}

// Restore rebuilds the data directory dataDir from the newest backup in
// from (package backup, Restore). dataDir must not exist or be empty.
// The tables, the device index and the rollup period databases are
// created with the options the store opens them with; the stream
// positions and tombstones are written, so a store opened on dataDir
// resumes the stream past the positions.
func Restore(ctx context.Context, from, dataDir string, opts backup.RestoreOptions) (backup.Manifest, error) {
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	return backup.Restore(ctx, from, dataDir, restoreTarget{dir: dataDir, log: log}, opts)
}

// restoreTarget is a data directory being restored.
type restoreTarget struct {
	dir string
	log *slog.Logger
}

var _ backup.Target = restoreTarget{}

// Prepare creates the tables directory.
func (to restoreTarget) Prepare() error {
	return os.MkdirAll(filepath.Join(to.dir, tablesDirName), 0o755)
}

// Create creates the database of t as the store opens it.
func (to restoreTarget) Create(t backup.Table) (*badger.DB, error) {
	switch {
	case t.Rollup != "":
		dir := filepath.Join(to.dir, rollupsDirName, filepath.FromSlash(t.Rollup))
		return badgeropts.Open(badgeropts.Rollup(dir, false, false, to.log))
	case t.Day != "":
		return badgeropts.OpenManaged(badgeropts.For(filepath.Join(to.dir, tablesDirName, t.Day), badgeropts.Cold, false, false, to.log))
	}
	return badgeropts.Open(badgeropts.For(filepath.Join(to.dir, indexDirName), badgeropts.Index, false, false, to.log))
}

// Clean leaves the directory as it was found, so a retry can start
// over.
func (to restoreTarget) Clean() {
	for _, name := range []string{tablesDirName, indexDirName, rollupsDirName, replay.PositionsFileName, replay.TombstonesFileName, restoredFileName} {
		_ = os.RemoveAll(filepath.Join(to.dir, name))
	}
}

// Finish writes the positions and tombstones of m into the data
// directory, in the files the store reads at Open, and the marker that
// Restored finds.
func (to restoreTarget) Finish(m backup.Manifest) error {
	dataDir := to.dir
	pos := make(map[string]replay.Position, len(m.Positions))
	for name, p := range m.Positions {
		pos[name] = replay.Position{Created: p.Created.UnixNano(), Seq: p.Seq}
	}
	if err := replay.WritePositions(dataDir, pos); err != nil {
		return err
	}
	recs := make([]replay.TombstoneRecord, 0, len(m.Tombstones))
	for _, d := range slices.Sorted(maps.Keys(m.Tombstones)) {
		if _, err := buckets.ParseDay(d); err != nil {
			return fmt.Errorf("tombstone: %w", err)
		}
		recs = append(recs, replay.TombstoneRecord{Day: d, Dropped: m.Tombstones[d].UTC()})
	}
	if err := replay.WriteTombstones(dataDir, recs); err != nil {
		return err
	}
	b, err := json.Marshal(struct {
		ID      int       `json:"backup_id"`
		Created time.Time `json:"backup_created"`
	}{m.ID, m.Created})
	if err != nil {
		return err
	}
	return atomicfile.Replace(dataDir, restoredFileName, b)
}

// Restored reports whether the data directory was made by Restore and
// no consumer of the stream has been set to resume from its positions
// yet. A consumer that outlived the restore has acknowledged messages
// past them, so the caller deletes it (a new one starts after the
// saved positions) and then calls ClearRestored.
func (s *Store) Restored() bool {
	_, err := os.Stat(filepath.Join(s.dir, restoredFileName))
	return err == nil
}

// ClearRestored forgets that the directory was restored.
func (s *Store) ClearRestored() error {
	err := os.Remove(filepath.Join(s.dir, restoredFileName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("clear restore marker: %w", err)
	}
	return atomicfile.SyncDir(s.dir)
}

// salvager writes the sound blocks of a damaged table into s.
func (s *Store) salvager() *repair.Salvager {
	return &repair.Salvager{
		Store:  s,
		Blocks: tableBlocks{},
		Options: func(dir string, readOnly bool) badger.Options {
			return badgeropts.For(dir, badgeropts.Cold, false, readOnly, s.log)
		},
		Open: badgeropts.OpenManaged,
		Log:  s.log,
	}
}

// tableBlocks reads the blocks of a day table for a repair.
type tableBlocks struct{}

var _ repair.Blocks = tableBlocks{}

// ParseKey splits a block key into device and sequence.
func (tableBlocks) ParseKey(key []byte) (buckets.DeviceID, uint64, bool) {
	dev, ref, ok := parseAnyBlockKey(key)
	return dev, ref.seq, ok
}

// Decode checks and decodes a block, as a read does.
func (tableBlocks) Decode(dev buckets.DeviceID, v []byte) ([]buckets.Reading, error) {
	_, rs, err := block.Decode(v, dev)
	return rs, err
}
