package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/ristretto/v2/z"
	"go.opentelemetry.io/otel/metric"
	"google.golang.org/protobuf/proto"

	"github.com/telemetryd/telemetryd/buckets"
)

// A backup directory holds a chain of backups of one data directory:
//
//	MANIFEST.json          the newest backup's manifest (replaced atomically)
//	LOCK                   flock held while a backup writes here
//	000001/                the first backup: a full copy
//	    manifest.json      its manifest
//	    index.kv           the device index (Badger backup format), in full
//	    tables/DAY.kv      one file per day table
//	    tables/DAY.keys    the keys of the table (backupkeys.go)
//	    rollups/LEVEL/YYYY-MM.kv, .keys
//	                       one rollup period database and its keys
//	                       (backuprollups.go)
//	000002/                a later backup: only what changed since 000001
//
// A manifest lists, per day table and for the index, every file a
// restore loads, in order: for a table the full copy, then each
// incremental one (the entries with a version above the one the
// previous file reached, and the deletion of every key the previous
// backup listed that the table no longer holds). So the newest
// manifest alone describes a restore, and a table dropped since an
// older backup is simply not in it. A table that did not change is not
// copied again.
//
// Consistency: the stream positions are read first, then the index and
// each table are copied, each at one snapshot (Badger's version of its
// last completed commit). Every reading a saved position vouches for was
// committed before the position was saved, so it is in the copy; the
// copy may hold newer readings too, and a replay from the positions
// writes those again, which changes nothing.

// BackupFormat is the newest format version of the backup manifests
// this build writes and reads: format 2 lists rollup databases. A
// backup without rollups is written as format 1 (backupFormatTables),
// which builds from before the rollups read too; one with rollups is
// refused by them rather than restored without its rollups.
const BackupFormat = 2

// backupFormatTables is the format of a manifest without rollups.
const backupFormatTables = 1

// File names in a backup directory.
const (
	backupManifestName = "MANIFEST.json"
	backupLockName     = "LOCK"
	backupIndexName    = "index.kv"
	// restoredFileName in a data directory says that Restore made it
	// and no service has resumed the stream on it yet (Restored).
	restoredFileName = "RESTORED"
)

// backupReaders is how many goroutines read a table for its copy.
const backupReaders = 2

// loadPendingWrites is how many batches a restore keeps in flight per
// database.
const loadPendingWrites = 16

// ErrBackupCorrupt is wrapped by Restore when a file of the backup does
// not match its manifest.
var ErrBackupCorrupt = errors.New("backup file does not match its manifest")

// BackupManifest describes one backup and everything a restore from it
// loads.
type BackupManifest struct {
	Format  int       `json:"format"`
	ID      int       `json:"id"`
	Created time.Time `json:"created"`
	// Positions are the stream positions the copy is consistent with:
	// the copy holds every message up to them (and maybe later ones).
	Positions map[string]BackupPosition `json:"positions"`
	// Tombstones are the days dropped before the backup, with when.
	Tombstones map[string]time.Time `json:"tombstones"`
	Index      BackupTable          `json:"index"`
	Tables     []BackupTable        `json:"tables"`
	// Rollups are the rollup period databases (backuprollups.go).
	Rollups []BackupTable `json:"rollups,omitempty"`
	// CopiedBytes and CopiedFiles are what this backup wrote; Skipped
	// counts the tables that had not changed since the previous one.
	CopiedBytes int64 `json:"copied_bytes"`
	CopiedFiles int   `json:"copied_files"`
	Skipped     int   `json:"skipped_tables"`
}

// BackupPosition is the position of one stream in a manifest.
type BackupPosition struct {
	Created time.Time `json:"created"`
	Seq     uint64    `json:"seq"`
}

// BackupTable is one database in a manifest: a day table (Day set), a
// rollup period (Rollup set: "<level>/YYYY-MM") or the device index.
type BackupTable struct {
	Day    string `json:"day,omitempty"`
	Rollup string `json:"rollup,omitempty"`
	// Version is the Badger version the copy reached: the next
	// incremental copy takes the entries above it.
	Version uint64 `json:"version"`
	// Inode identifies the table's directory, so a table dropped and
	// written again since the previous backup is copied in full.
	Inode uint64       `json:"inode,omitempty"`
	Files []BackupFile `json:"files"`
	// Keys, of a day table, lists the keys the table held at Version
	// (backupkeys.go): the next incremental copy deletes those it no
	// longer holds. A restore does not read it.
	Keys *BackupFile `json:"keys,omitempty"`
}

// BackupFile is one file of a backup, relative to the backup directory.
type BackupFile struct {
	Path string `json:"path"`
	// Since is 0 for a full copy; an incremental one holds the entries
	// with versions above it.
	Since   uint64 `json:"since"`
	Version uint64 `json:"version"`
	Size    int64  `json:"size"`
	SHA256  string `json:"sha256"`
}

// Bytes is the total size of the files a restore of t loads.
func (t BackupTable) Bytes() int64 {
	var n int64
	for _, f := range t.Files {
		n += f.Size
	}
	return n
}

// TotalBytes is what a restore of m loads: the device index, every
// table and every rollup period, all their files.
func (m BackupManifest) TotalBytes() int64 {
	n := m.Index.Bytes()
	for _, t := range append(slices.Clip(m.Tables), m.Rollups...) {
		n += t.Bytes()
	}
	return n
}

// Sequences are the stream positions of m: stream -> last sequence the
// backup holds.
func (m BackupManifest) Sequences() map[string]uint64 {
	seqs := make(map[string]uint64, len(m.Positions))
	for name, p := range m.Positions {
		seqs[name] = p.Seq
	}
	return seqs
}

// BackupProgress reports one step of a backup or a restore.
type BackupProgress struct {
	// Name is the database: a day ("2026-11-25"), "index" or a rollup
	// period ("rollups/1m/2026-11").
	Name string
	// Done and Total count the databases.
	Done, Total int
	// Bytes is what the step copied or loaded; Skipped says the table
	// had not changed.
	Bytes   int64
	Skipped bool
}

// BackupOptions configures Backup.
type BackupOptions struct {
	// Full copies everything even when the directory holds an earlier
	// backup (starting a new chain).
	Full bool
	// Progress, if set, is called after each database.
	Progress func(BackupProgress)
	// Now is the clock of the manifest's Created time (nil: time.Now).
	Now func() time.Time
}

// Backup copies every day table, the device index and every rollup
// period database into dir, which
// is created if needed, incrementally against the newest backup already
// in dir unless opts.Full. It works on an open store while it is being
// written, and on a read-only one (a stopped data dir). Only one backup
// writes to a directory at a time.
func (s *Store) Backup(ctx context.Context, dir string, opts BackupOptions) (BackupManifest, error) {
	m, err := s.backup(ctx, dir, opts)
	if err != nil {
		s.metrics.backups.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(outcomeFailed))
		return BackupManifest{}, err
	}
	s.metrics.backups.Add(ctx, 1, metric.WithAttributes(outcomeOK))
	s.metrics.backupBytes.Add(ctx, m.CopiedBytes)
	s.lastBackup.Store(time.Now().Unix())
	return m, nil
}

func (s *Store) backup(ctx context.Context, dir string, opts BackupOptions) (BackupManifest, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return BackupManifest{}, fmt.Errorf("backup: %w", err)
	}
	lock, err := lockBackupDir(dir)
	if err != nil {
		return BackupManifest{}, err
	}
	defer func() { _ = lock.unlock() }()
	prev, err := readManifest(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return BackupManifest{}, fmt.Errorf("backup: previous backup in %s: %w", dir, err)
	}
	if opts.Full || err != nil {
		prev = BackupManifest{ID: prev.ID}
	}
	b := &backupRun{s: s, dir: dir, opts: opts, prev: prev}
	m, err := b.run(ctx)
	if err != nil {
		_ = os.RemoveAll(filepath.Join(dir, b.sub))
		return BackupManifest{}, err
	}
	return m, nil
}

// backupRun is one backup under way.
type backupRun struct {
	s    *Store
	dir  string
	sub  string // this backup's subdirectory, relative to dir
	opts BackupOptions
	prev BackupManifest
	m    BackupManifest
}

func (b *backupRun) run(ctx context.Context) (BackupManifest, error) {
	s := b.s
	b.m = BackupManifest{Format: BackupFormat, ID: b.prev.ID + 1, Created: b.opts.Now().UTC(), Positions: map[string]BackupPosition{}}
	b.sub = BackupID(b.m.ID)
	// A subdirectory the manifest does not list is what an interrupted
	// backup left.
	if err := os.RemoveAll(filepath.Join(b.dir, b.sub)); err != nil {
		return b.m, fmt.Errorf("backup: remove an interrupted backup: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(b.dir, b.sub, tablesDirName), 0o755); err != nil {
		return b.m, fmt.Errorf("backup: %w", err)
	}
	// The positions first: every reading they vouch for is committed
	// already, so the copies made after this hold it.
	if err := b.positions(); err != nil {
		return b.m, err
	}
	days := s.daysBetween(0, buckets.Day(1<<31-1), buckets.Asc)
	rollups, viewRollup, err := s.rollupPeriodsOf()
	if err != nil {
		return b.m, fmt.Errorf("backup: %w", err)
	}
	total := len(days) + 1 + len(rollups)
	if err := b.index(ctx, total); err != nil {
		return b.m, err
	}
	prevTables := map[string]BackupTable{}
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
	b.m.Tombstones = map[string]time.Time{}
	for _, t := range s.Tombstones() {
		b.m.Tombstones[t.Day.String()] = t.Dropped.UTC()
	}
	return b.m, b.finish()
}

// positions reads the saved stream positions into the manifest, after
// a sync has written the pending ones (syncloop.go): their readings are
// committed, so the tables copied next hold them.
func (b *backupRun) positions() error {
	if !b.s.opts.SyncWrites {
		b.s.syncAll()
	}
	b.s.replay.posMu.Lock()
	pos, err := readPositions(b.s.dir)
	b.s.replay.posMu.Unlock()
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	for name, p := range pos {
		b.m.Positions[name] = BackupPosition{Created: time.Unix(0, p.Created).UTC(), Seq: p.Seq}
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
	idx := b.s.index
	if !b.s.opts.ReadOnly {
		if err := idx.Flush(); err != nil {
			return fmt.Errorf("backup: save device index: %w", err)
		}
	}
	entry := BackupTable{Version: idx.DB().MaxVersion()}
	if prev := b.prev.Index; len(prev.Files) > 0 && prev.Version == entry.Version {
		b.m.Index = prev // not written since
		b.report(BackupProgress{Name: "index", Done: 1, Total: total, Skipped: true})
		return ctx.Err()
	}
	f, err := b.copyDB(ctx, backupIndexName, 0, func(w io.Writer) (uint64, error) {
		st := idx.DB().NewStream()
		st.LogPrefix = "backup index"
		st.NumGo = backupReaders
		return streamNewest(ctx, st, 0, w)
	})
	if err != nil {
		return fmt.Errorf("backup device index: %w", err)
	}
	b.add(&entry, f)
	b.m.Index = entry
	b.report(BackupProgress{Name: "index", Done: 1, Total: total, Bytes: f.Size})
	return ctx.Err()
}

// table copies the table of day at its last completed commit: in full,
// or the entries above prev's version when prev is the same table.
func (b *backupRun) table(ctx context.Context, day buckets.Day, prev BackupTable, done, total int) error {
	t, err := b.s.acquire(ctx, day, forRead)
	if err != nil {
		return fmt.Errorf("backup table %s: %w", day, err)
	}
	if t == nil { // dropped meanwhile
		return nil
	}
	defer b.s.release(t)
	at, unpin := t.pinVersion()
	defer unpin()
	ino := dirInode(t.dir)
	since, prev := b.chain(day.String(), prev, ino, at)
	entry := BackupTable{Day: day.String(), Version: at, Inode: ino, Files: slices.Clone(prev.Files), Keys: prev.Keys}
	var f BackupFile
	if since == 0 || at > since {
		name := filepath.Join(tablesDirName, day.String()+".kv")
		keys := filepath.Join(tablesDirName, day.String()+".keys")
		err = b.s.guard(t, func() error {
			f, err = b.copyDB(ctx, name, since, func(w io.Writer) (uint64, error) {
				st := t.db.NewStreamAt(at)
				st.LogPrefix = "backup " + day.String()
				// Two readers: a backup runs beside ingest and queries, and
				// each reader holds batches of up to 32 MiB.
				st.NumGo = backupReaders
				version, err := streamNewest(ctx, st, since, w)
				if err != nil {
					return 0, err
				}
				txn := t.db.NewTransactionAt(at, false)
				defer txn.Discard()
				entry.Keys, err = b.listKeys(ctx, txn, at, prev.Keys, keys, w, nil)
				return version, err
			})
			return err
		})
		if err != nil {
			return fmt.Errorf("backup table %s: %w", day, err)
		}
		b.m.CopiedBytes += entry.Keys.Size
		b.m.CopiedFiles++
	} else {
		b.m.Skipped++
	}
	b.add(&entry, f)
	b.m.Tables = append(b.m.Tables, entry)
	b.report(BackupProgress{Name: day.String(), Done: done, Total: total, Bytes: f.Size, Skipped: f.Path == ""})
	return nil
}

// chain returns the version an incremental copy of the table of day at
// version at starts above, with prev, its entry in the previous
// backup; 0 and an empty prev when the table must be copied in full:
// it is not in the previous backup, or not the same table (its
// directory or its versions differ), or the previous key list does not
// match its manifest.
func (b *backupRun) chain(name string, prev BackupTable, ino, at uint64) (since uint64, _ BackupTable) {
	switch {
	case len(prev.Files) == 0 || prev.Inode != ino || prev.Keys == nil || at < prev.Version:
		return 0, BackupTable{}
	case at > prev.Version:
		if err := verifyFile(b.dir, *prev.Keys); err != nil {
			b.s.log.Warn("backup: the key list of the previous backup does not match its manifest; copying the database in full",
				"database", name, "err", err)
			return 0, BackupTable{}
		}
	}
	return prev.Version, prev
}

// add appends f to entry unless it is empty.
func (b *backupRun) add(entry *BackupTable, f BackupFile) {
	if f.Path == "" {
		return
	}
	entry.Files = append(entry.Files, f)
	b.m.CopiedBytes += f.Size
	b.m.CopiedFiles++
}

func (b *backupRun) report(p BackupProgress) {
	if b.opts.Progress != nil {
		b.opts.Progress(p)
	}
}

// copyDB writes what write streams into name under this backup's
// subdirectory, synced, with its checksum. A copy that holds no entry
// (an incremental one of a table whose commits wrote nothing new) is
// removed and returned empty.
func (b *backupRun) copyDB(ctx context.Context, name string, since uint64, write func(io.Writer) (uint64, error)) (BackupFile, error) {
	if err := ctx.Err(); err != nil {
		return BackupFile{}, err
	}
	rel := filepath.Join(b.sub, name)
	path := filepath.Join(b.dir, rel)
	out, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return BackupFile{}, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, h)}
	version, err := write(cw)
	if err == nil {
		err = out.Sync()
	}
	err = errors.Join(err, out.Close())
	if err != nil {
		return BackupFile{}, err
	}
	if cw.n == 0 && since > 0 {
		return BackupFile{}, os.Remove(path)
	}
	return BackupFile{Path: filepath.ToSlash(rel), Since: since, Version: version, Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// finish writes the manifest into the subdirectory and then, atomically,
// as the directory's newest manifest.
func (b *backupRun) finish() error {
	if len(b.m.Rollups) == 0 {
		b.m.Format = backupFormatTables
	}
	data, err := json.MarshalIndent(b.m, "", "  ")
	if err != nil {
		return fmt.Errorf("backup manifest: %w", err)
	}
	dirs := []string{filepath.Join(b.dir, b.sub, tablesDirName)}
	for _, t := range b.m.Rollups {
		if d := filepath.Join(b.dir, b.sub, rollupsDirName, filepath.FromSlash(path.Dir(t.Rollup))); !slices.Contains(dirs, d) {
			dirs = append(dirs, d)
		}
	}
	if len(b.m.Rollups) > 0 {
		dirs = append(dirs, filepath.Join(b.dir, b.sub, rollupsDirName))
	}
	for _, d := range append(dirs, filepath.Join(b.dir, b.sub)) {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			continue // every rollup of a level unchanged
		}
		if err := syncDir(d); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
	}
	if err := replaceFile(filepath.Join(b.dir, b.sub), "manifest.json", data); err != nil {
		return fmt.Errorf("backup manifest: %w", err)
	}
	if err := replaceFile(b.dir, backupManifestName, data); err != nil {
		return fmt.Errorf("backup manifest: %w", err)
	}
	return nil
}

// pinVersion returns the version of the last completed commit of t and
// keeps compaction from dropping what a reader at it sees until unpin.
// A reference to t must be held until unpin.
func (t *table) pinVersion() (at uint64, unpin func()) {
	txn, done := t.readTxn()
	return txn.ReadTs(), done
}

// badgerDeleteMeta is the meta bit of a Badger deletion marker in its
// backup format (bitDelete in Badger).
const badgerDeleteMeta = 1

// streamNewest writes, in Badger's backup format (what DB.Load reads),
// the newest version of every key that was written after since and is
// not deleted; the deletions are listKeys' work. Badger's own
// Stream.Backup writes every version above since, which for a day
// table is mostly the blocks the compactor merged away meanwhile, and
// a deletion only while Badger still keeps its marker: one that
// compaction dropped with the block it deleted left that block in the
// restore. It returns the highest version written.
func streamNewest(ctx context.Context, st *badger.Stream, since uint64, w io.Writer) (uint64, error) {
	st.SinceTs = since
	st.KeyToList = func(key []byte, itr *badger.Iterator) (*pb.KVList, error) {
		return newestKV(itr.Item(), since)
	}
	var maxVersion uint64
	st.Send = func(buf *z.Buffer) error {
		list, err := badger.BufferToKVList(buf)
		if err != nil {
			return err
		}
		out := list.Kv[:0]
		for _, kv := range list.Kv {
			if kv.StreamDone {
				continue
			}
			maxVersion = max(maxVersion, kv.Version)
			out = append(out, kv)
		}
		if len(out) == 0 {
			return nil
		}
		list.Kv = out
		return writeKVList(w, list)
	}
	if err := st.Orchestrate(ctx); err != nil {
		return 0, err
	}
	return maxVersion, nil
}

// writeKVList writes list in Badger's backup format: its length, 8
// bytes little-endian, then the list.
func writeKVList(w io.Writer, list *pb.KVList) error {
	b, err := proto.Marshal(list)
	if err != nil {
		return err
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// newestKV is the entry streamNewest writes for item, the newest
// version of its key: none when it is not above since, or deleted.
func newestKV(item *badger.Item, since uint64) (*pb.KVList, error) {
	if item.Version() <= since {
		return &pb.KVList{}, nil
	}
	kv := &pb.KV{Key: item.KeyCopy(nil), Version: item.Version(), UserMeta: []byte{item.UserMeta()}, ExpiresAt: item.ExpiresAt()}
	if item.IsDeletedOrExpired() {
		return &pb.KVList{}, nil
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	kv.Value = v
	return &pb.KVList{Kv: []*pb.KV{kv}}, nil
}

// dirInode is the inode number of dir, 0 if unknown.
func dirInode(dir string) uint64 {
	info, err := os.Stat(dir)
	if err != nil {
		return 0
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// readManifest reads the newest manifest of the backup directory dir.
func readManifest(dir string) (BackupManifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, backupManifestName))
	if err != nil {
		return BackupManifest{}, err
	}
	var m BackupManifest
	if err := json.Unmarshal(data, &m); err != nil {
		return BackupManifest{}, fmt.Errorf("%s: %w", filepath.Join(dir, backupManifestName), err)
	}
	if m.Format < backupFormatTables || m.Format > BackupFormat {
		return BackupManifest{}, fmt.Errorf("%s: backup format %d, this build reads %d to %d", filepath.Join(dir, backupManifestName), m.Format, backupFormatTables, BackupFormat)
	}
	return m, nil
}

// lockBackupDir takes an exclusive lock on the backup directory.
func lockBackupDir(dir string) (*dirLock, error) {
	f, err := os.OpenFile(filepath.Join(dir, backupLockName), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("backup: %s: another backup is writing there: %w", dir, err)
	}
	return &dirLock{f: f}, nil
}

// RestoreOptions configures Restore.
type RestoreOptions struct {
	// Progress, if set, is called after each database is loaded.
	Progress func(BackupProgress)
	// Logger receives Badger's messages (nil: slog.Default()).
	Logger *slog.Logger
	// Keep names entries the data directory may already hold (such as
	// a NATS server's store kept beside the data), which Restore leaves
	// alone; any other entry makes it refuse the directory.
	Keep []string
}

// Restore rebuilds a data directory from the newest backup in from.
// dataDir must not exist or be empty. Every file is checked against its
// manifest before anything is written (ErrBackupCorrupt names the first
// that differs); then each table and the index are loaded, full copy
// first and incremental ones in order, and the stream positions and
// tombstones are written, so a store opened on dataDir resumes the
// stream past the positions. The rollup period databases are loaded
// after the tables, into dataDir/rollups/LEVEL/YYYY-MM.
func Restore(ctx context.Context, from, dataDir string, opts RestoreOptions) (BackupManifest, error) {
	m, err := readManifest(from)
	if err != nil {
		return BackupManifest{}, fmt.Errorf("restore: %w", err)
	}
	if err := checkEmptyDir(dataDir, opts.Keep); err != nil {
		return m, err
	}
	if err := VerifyBackup(ctx, from, m); err != nil {
		return m, err
	}
	if err := load(ctx, from, dataDir, m, opts); err != nil {
		// Leave the directory as it was found, so a retry can start over.
		for _, name := range []string{tablesDirName, indexDirName, rollupsDirName, positionsFileName, tombstonesFileName, restoredFileName} {
			_ = os.RemoveAll(filepath.Join(dataDir, name))
		}
		return m, err
	}
	return m, nil
}

// load loads every database of m into dataDir and writes the state
// files.
func load(ctx context.Context, from, dataDir string, m BackupManifest, opts RestoreOptions) error {
	if err := os.MkdirAll(filepath.Join(dataDir, tablesDirName), 0o755); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	total := len(m.Tables) + 1 + len(m.Rollups)
	report := func(p BackupProgress) {
		if opts.Progress != nil {
			opts.Progress(p)
		}
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := loadDB(ctx, from, badgerOptions(filepath.Join(dataDir, indexDirName), classIndex, false, false, log), openBadger, m.Index.Files); err != nil {
		return fmt.Errorf("restore device index: %w", err)
	}
	report(BackupProgress{Name: "index", Done: 1, Total: total, Bytes: m.Index.Bytes()})
	for i, t := range m.Tables {
		if err := loadDB(ctx, from, badgerOptions(filepath.Join(dataDir, tablesDirName, t.Day), classCold, false, false, log), openTableBadger, t.Files); err != nil {
			return fmt.Errorf("restore table %s: %w", t.Day, err)
		}
		report(BackupProgress{Name: t.Day, Done: i + 2, Total: total, Bytes: t.Bytes()})
	}
	for i, t := range m.Rollups {
		dir, err := rollupDir(dataDir, t.Rollup)
		if err == nil {
			err = loadDB(ctx, from, rollupBadgerOptions(dir, false, false, log), openBadger, t.Files)
		}
		if err != nil {
			return fmt.Errorf("restore rollup %s: %w", t.Rollup, err)
		}
		report(BackupProgress{Name: rollupsDirName + "/" + t.Rollup, Done: len(m.Tables) + i + 2, Total: total, Bytes: t.Bytes()})
	}
	if err := writeRestoredState(dataDir, m); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}

// checkEmptyDir refuses a dataDir that holds anything but keep.
func checkEmptyDir(dataDir string, keep []string) error {
	entries, err := os.ReadDir(dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	for _, e := range entries {
		if !slices.Contains(keep, e.Name()) {
			return fmt.Errorf("restore: data directory %s is not empty (it holds %s); restore only into an empty or new directory", dataDir, e.Name())
		}
	}
	return nil
}

// VerifyBackup checks every file m lists in the backup directory from
// against its size and SHA-256.
func VerifyBackup(ctx context.Context, from string, m BackupManifest) error {
	all := append(append([]BackupTable{m.Index}, m.Tables...), m.Rollups...)
	for i, t := range all {
		switch {
		case i > len(m.Tables):
			if _, err := rollupDir("", t.Rollup); err != nil {
				return fmt.Errorf("restore: %s: %w", from, err)
			}
		case i > 0:
			if d, err := buckets.ParseDay(t.Day); err != nil || d.String() != t.Day {
				return fmt.Errorf("restore: manifest of %s lists a table %q that is not a day", from, t.Day)
			}
		}
		files := t.Files
		if t.Keys != nil {
			files = append(slices.Clip(files), *t.Keys)
		}
		for _, f := range files {
			if !filepath.IsLocal(filepath.FromSlash(f.Path)) {
				return fmt.Errorf("restore: manifest of %s lists a file %q outside the backup directory", from, f.Path)
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := verifyFile(from, f); err != nil {
				return err
			}
		}
	}
	return nil
}

func verifyFile(from string, f BackupFile) error {
	path := filepath.Join(from, filepath.FromSlash(f.Path))
	in, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("restore: %w: %s: %w", ErrBackupCorrupt, path, err)
	}
	defer in.Close()
	h := sha256.New()
	n, err := io.Copy(h, in)
	if err != nil {
		return fmt.Errorf("restore: read %s: %w", path, err)
	}
	if n != f.Size {
		return fmt.Errorf("restore: %w: %s is %d bytes, the manifest says %d", ErrBackupCorrupt, path, n, f.Size)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != f.SHA256 {
		return fmt.Errorf("restore: %w: %s has SHA-256 %s, the manifest says %s", ErrBackupCorrupt, path, sum, f.SHA256)
	}
	return nil
}

// loadDB creates the database of opts and loads files into it in
// order.
func loadDB(ctx context.Context, from string, opts badger.Options, open func(badger.Options) (*badger.DB, error), files []BackupFile) error {
	db, err := open(opts)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return errors.Join(err, db.Close())
		}
		if err := loadFile(db, filepath.Join(from, filepath.FromSlash(f.Path))); err != nil {
			return errors.Join(fmt.Errorf("load %s: %w", f.Path, err), db.Close())
		}
	}
	return db.Close()
}

func loadFile(db *badger.DB, path string) error {
	in, err := os.Open(path)
	if err != nil {
		return err
	}
	defer in.Close()
	return db.Load(in, loadPendingWrites)
}

// writeRestoredState writes the positions and tombstones of m into
// dataDir, in the files the store reads at Open.
func writeRestoredState(dataDir string, m BackupManifest) error {
	pos := make(map[string]positionRecord, len(m.Positions))
	for name, p := range m.Positions {
		pos[name] = positionRecord{Created: p.Created.UnixNano(), Seq: p.Seq}
	}
	b, err := json.Marshal(pos)
	if err != nil {
		return err
	}
	if err := replaceFile(dataDir, positionsFileName, b); err != nil {
		return err
	}
	recs := make([]tombstoneRecord, 0, len(m.Tombstones))
	for _, d := range slices.Sorted(maps.Keys(m.Tombstones)) {
		if _, err := buckets.ParseDay(d); err != nil {
			return fmt.Errorf("tombstone: %w", err)
		}
		recs = append(recs, tombstoneRecord{Day: d, Dropped: m.Tombstones[d].UTC()})
	}
	if b, err = json.Marshal(recs); err != nil {
		return err
	}
	if err := replaceFile(dataDir, tombstonesFileName, b); err != nil {
		return err
	}
	if b, err = json.Marshal(struct {
		ID      int       `json:"backup_id"`
		Created time.Time `json:"backup_created"`
	}{m.ID, m.Created}); err != nil {
		return err
	}
	return replaceFile(dataDir, restoredFileName, b)
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
	return syncDir(s.dir)
}

// BackupID formats a backup's ID as its subdirectory name.
func BackupID(id int) string { return fmt.Sprintf("%06d", id) }
