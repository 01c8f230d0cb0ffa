package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/atomicfile"
)

// Source is the store a backup copies, declared here so that the store
// needs no part of this package's workings.
type Source interface {
	// Positions returns the saved stream positions, after the pending
	// ones are written: every reading they vouch for is committed.
	Positions() (map[string]Position, error)
	// Index returns the device index's database, after its pending
	// updates are saved.
	Index() (*badger.DB, error)
	// Days lists the day tables, oldest first.
	Days() []buckets.Day
	// Table calls fn with the database of the table of day, its
	// directory and the version of its last completed commit, which
	// stays readable until fn returns. It does not call fn when the
	// table was dropped meanwhile.
	Table(ctx context.Context, day buckets.Day, fn func(db *badger.DB, dir string, at uint64) error) error
	// Rollups lists the rollup period databases ("<level>/YYYY-MM")
	// and returns a function that calls fn with the directory and the
	// database of one of them (false when it was dropped meanwhile).
	Rollups() (names []string, view func(name string, fn func(dir string, db *badger.DB) error) (bool, error), err error)
	// Tombstones lists the dropped days ("YYYY-MM-DD") with when.
	Tombstones() map[string]time.Time
}

// Run copies every day table, the device index and every rollup
// period database of src into dir, which
// is created if needed, incrementally against the newest backup already
// in dir unless opts.Full. It works on an open store while it is being
// written, and on a read-only one (a stopped data dir). Only one backup
// writes to a directory at a time.
func Run(ctx context.Context, src Source, dir string, opts Options) (Manifest, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Manifest{}, fmt.Errorf("backup: %w", err)
	}
	lock, err := lockBackupDir(dir)
	if err != nil {
		return Manifest{}, err
	}
	defer func() { _ = lock.unlock() }()
	prev, err := ReadManifest(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Manifest{}, fmt.Errorf("backup: previous backup in %s: %w", dir, err)
	}
	if opts.Full || err != nil {
		prev = Manifest{ID: prev.ID}
	}
	b := &backupRun{src: src, dir: dir, opts: opts, prev: prev}
	m, err := b.run(ctx)
	if err != nil {
		_ = os.RemoveAll(filepath.Join(dir, b.sub))
		return Manifest{}, err
	}
	return m, nil
}

// backupRun is one backup under way.
type backupRun struct {
	src  Source
	dir  string
	sub  string // this backup's subdirectory, relative to dir
	opts Options
	prev Manifest
	m    Manifest
}

func (b *backupRun) run(ctx context.Context) (Manifest, error) {
	b.m = Manifest{Format: Format, ID: b.prev.ID + 1, Created: b.opts.Now().UTC(), Positions: map[string]Position{}}
	b.sub = ID(b.m.ID)
	// A subdirectory the manifest does not list is what an interrupted
	// backup left.
	if err := os.RemoveAll(filepath.Join(b.dir, b.sub)); err != nil {
		return b.m, fmt.Errorf("backup: remove an interrupted backup: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(b.dir, b.sub, tablesDir), 0o755); err != nil {
		return b.m, fmt.Errorf("backup: %w", err)
	}
	// The positions first: every reading they vouch for is committed
	// already, so the copies made after this hold it.
	if err := b.positions(); err != nil {
		return b.m, err
	}
	days := b.src.Days()
	rollups, viewRollup, err := b.src.Rollups()
	if err != nil {
		return b.m, fmt.Errorf("backup: %w", err)
	}
	total := len(days) + 1 + len(rollups)
	if err := b.index(ctx, total); err != nil {
		return b.m, err
	}
	prevTables := map[string]Table{}
	for _, t := range b.prev.Tables {
		prevTables[t.Day] = t
	}
	for i, day := range days {
		if err := ctx.Err(); err != nil {
			return b.m, err
		}
		if err := b.table(ctx, day, prevTables[day.String()], i+2, total); err != nil {
			return b.m, err
		}
	}
	if err := b.rollups(ctx, rollups, viewRollup, len(days)+1, total); err != nil {
		return b.m, err
	}
	// Tombstones last: a day dropped while the tables were copied is
	// then both absent (or copied) and tombstoned, so a replay does not
	// bring its readings back.
	b.m.Tombstones = b.src.Tombstones()
	return b.m, b.finish()
}

// positions reads the saved stream positions into the manifest.
func (b *backupRun) positions() error {
	pos, err := b.src.Positions()
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	for name, p := range pos {
		b.m.Positions[name] = p
	}
	return nil
}

// index copies the device index, in full whenever it changed: it holds
// one record per device and attribute, each rewritten often, so a copy
// of its newest records is smaller than Badger's incremental one (every
// version written since), and it needs no deletions carried over. Its
// pending updates are saved first, so it holds every device the copied
// positions vouch for.
func (b *backupRun) index(ctx context.Context, total int) error {
	db, err := b.src.Index()
	if err != nil {
		return fmt.Errorf("backup: save device index: %w", err)
	}
	entry := Table{Version: lastCommit(db)}
	if prev := b.prev.Index; len(prev.Files) > 0 && prev.Version == entry.Version {
		b.m.Index = prev // not written since
		b.report(Progress{Name: "index", Done: 1, Total: total, Skipped: true})
		return ctx.Err()
	}
	f, err := b.copyDB(ctx, indexName, 0, func(w io.Writer) (uint64, error) {
		st := db.NewStream()
		st.LogPrefix = "backup index"
		st.NumGo = backupReaders
		return streamNewest(ctx, st, 0, w)
	})
	if err != nil {
		return fmt.Errorf("backup device index: %w", err)
	}
	b.add(&entry, f)
	b.m.Index = entry
	b.report(Progress{Name: "index", Done: 1, Total: total, Bytes: f.Size})
	return ctx.Err()
}

// table copies the table of day at its last completed commit: in full,
// or the entries above prev's version when prev is the same table.
func (b *backupRun) table(ctx context.Context, day buckets.Day, prev Table, done, total int) error {
	var entry Table
	var f File
	found := false
	err := b.src.Table(ctx, day, func(db *badger.DB, dir string, at uint64) error {
		found = true
		ino := dirInode(dir)
		since, prev := b.chain(day.String(), prev, ino, at)
		entry = Table{Day: day.String(), Version: at, Inode: ino, Files: slices.Clone(prev.Files), Keys: prev.Keys}
		if since > 0 && at <= since {
			b.m.Skipped++
			return nil
		}
		name := filepath.Join(tablesDir, day.String()+".kv")
		keys := filepath.Join(tablesDir, day.String()+".keys")
		var err error
		f, err = b.copyDB(ctx, name, since, func(w io.Writer) (uint64, error) {
			st := db.NewStreamAt(at)
			st.LogPrefix = "backup " + day.String()
			// Two readers: a backup runs beside ingest and queries, and
			// each reader holds batches of up to 32 MiB.
			st.NumGo = backupReaders
			version, err := streamNewest(ctx, st, since, w)
			if err != nil {
				return 0, err
			}
			txn := db.NewTransactionAt(at, false)
			defer txn.Discard()
			entry.Keys, err = b.listKeys(ctx, txn, at, prev.Keys, keys, w, nil)
			return version, err
		})
		if err != nil {
			return err
		}
		b.m.CopiedBytes += entry.Keys.Size
		b.m.CopiedFiles++
		return nil
	})
	if err != nil {
		return fmt.Errorf("backup table %s: %w", day, err)
	}
	if !found { // dropped meanwhile
		return nil
	}
	b.add(&entry, f)
	b.m.Tables = append(b.m.Tables, entry)
	b.report(Progress{Name: day.String(), Done: done, Total: total, Bytes: f.Size, Skipped: f.Path == ""})
	return nil
}

// chain returns the version an incremental copy of the table of day at
// version at starts above, with prev, its entry in the previous
// backup; 0 and an empty prev when the table must be copied in full:
// it is not in the previous backup, or not the same table (its
// directory or its versions differ), or the previous key list does not
// match its manifest.
func (b *backupRun) chain(name string, prev Table, ino, at uint64) (since uint64, _ Table) {
	switch {
	case len(prev.Files) == 0 || prev.Inode != ino || prev.Keys == nil || at < prev.Version:
		return 0, Table{}
	case at > prev.Version:
		if err := VerifyFile(b.dir, *prev.Keys); err != nil {
			b.opts.Logger.Warn("backup: the key list of the previous backup does not match its manifest; copying the database in full",
				"database", name, "err", err)
			return 0, Table{}
		}
	}
	return prev.Version, prev
}

// add appends f to entry unless it is empty.
func (b *backupRun) add(entry *Table, f File) {
	if f.Path == "" {
		return
	}
	entry.Files = append(entry.Files, f)
	b.m.CopiedBytes += f.Size
	b.m.CopiedFiles++
}

func (b *backupRun) report(p Progress) {
	if b.opts.Progress != nil {
		b.opts.Progress(p)
	}
}

// copyDB writes what write streams into name under this backup's
// subdirectory, synced, with its checksum. A copy that holds no entry
// (an incremental one of a table whose commits wrote nothing new) is
// removed and returned empty.
func (b *backupRun) copyDB(ctx context.Context, name string, since uint64, write func(io.Writer) (uint64, error)) (File, error) {
	if err := ctx.Err(); err != nil {
		return File{}, err
	}
	rel := filepath.Join(b.sub, name)
	path := filepath.Join(b.dir, rel)
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return File{}, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, h)}
	version, err := write(cw)
	if err == nil {
		err = out.Sync()
	}
	err = errors.Join(err, out.Close())
	if err != nil {
		return File{}, err
	}
	if cw.n == 0 && since > 0 {
		return File{}, os.Remove(path)
	}
	return File{Path: filepath.ToSlash(rel), Since: since, Version: version, Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// finish writes the manifest into the subdirectory and then, atomically,
// as the directory's newest manifest.
func (b *backupRun) finish() error {
	if len(b.m.Rollups) == 0 {
		b.m.Format = formatTables
	}
	data, err := json.MarshalIndent(b.m, "", "  ")
	if err != nil {
		return fmt.Errorf("backup manifest: %w", err)
	}
	dirs := []string{filepath.Join(b.dir, b.sub, tablesDir)}
	for _, t := range b.m.Rollups {
		if d := filepath.Join(b.dir, b.sub, rollupsDir, filepath.FromSlash(path.Dir(t.Rollup))); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	if len(b.m.Rollups) > 0 {
		dirs = append(dirs, filepath.Join(b.dir, b.sub, rollupsDir))
	}
	for _, d := range append(dirs, filepath.Join(b.dir, b.sub)) {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			continue // every rollup of a level unchanged
		}
		if err := atomicfile.SyncDir(d); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
	}
	if err := atomicfile.Replace(filepath.Join(b.dir, b.sub), "manifest.json", data); err != nil {
		return fmt.Errorf("backup manifest: %w", err)
	}
	if err := atomicfile.Replace(b.dir, manifestName, data); err != nil {
		return fmt.Errorf("backup manifest: %w", err)
	}
	return nil
}

// lastCommit is the version of db's newest commit (a database not in
// managed mode numbers its commits). It asks a read transaction, which
// waits for the commits before it: db.MaxVersion reads the memtable's
// newest version while a commit may be writing it.
func lastCommit(db *badger.DB) uint64 {
	txn := db.NewTransaction(false)
	defer txn.Discard()
	return txn.ReadTs()
}
