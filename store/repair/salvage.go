package repair

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	btable "github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"github.com/dgraph-io/ristretto/v2/z"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/backup"
	"github.com/telemetryd/telemetryd/store/blocked"
)

// Store is the store that salvaged readings are written back into.
type Store interface {
	// Write writes readings as ingest does: a reading that is already
	// stored is merged, later values winning per name.
	Write(ctx context.Context, rs []buckets.Reading) error
	// DeletedAt reports whether dev was deleted (and when); a deleted
	// device's blocks are left out.
	DeletedAt(dev buckets.DeviceID) (time.Time, bool)
}

// Blocks reads the stored blocks of a day table.
type Blocks interface {
	// ParseKey splits the key of a block into its device and the
	// block's sequence (the table version that wrote it); ok is false
	// for a key of another shape.
	ParseKey(key []byte) (dev buckets.DeviceID, seq uint64, ok bool)
	// Decode returns the readings of dev's block v after checking its
	// checksum.
	Decode(dev buckets.DeviceID, v []byte) ([]buckets.Reading, error)
}

// Salvager writes the sound blocks of a damaged table, or of a backup's
// copy of one, into a store.
type Salvager struct {
	Store  Store
	Blocks Blocks
	// Options are the Badger options of a day table in dir, opened
	// read-only or not; Open opens one.
	Options func(dir string, readOnly bool) badger.Options
	Open    func(badger.Options) (*badger.DB, error)
	Log     *slog.Logger
}

// repairBatch is how many readings a repair writes at once.
const repairBatch = buckets.MaxBatch

// Options configures a repair.
type Options struct {
	// Backup, when set, is a backup directory (package backup) whose newest
	// manifest's copy of the day is loaded first.
	Backup string
}

// Report is what a repair did.
type Report struct {
	Day buckets.Day
	// Damaged is where the damaged table's directory was moved.
	Damaged string
	// FromBackup and Salvaged count the readings written from the
	// backup and from the damaged copy (a reading in both counts twice).
	FromBackup, Salvaged int64
	// BadBlocks counts the blocks of the damaged copy that failed their
	// checksum; SkippedDevices the devices whose reading Badger could
	// not finish; SkippedFiles the table files that did not open when
	// the table was read file by file (salvage.go).
	BadBlocks, SkippedDevices, SkippedFiles int
	// SalvageErr says why the damaged copy did not open as a database
	// (empty when it did); it was then read file by file.
	SalvageErr string
}

// FromBackup loads the day's copy in the backup dir into scratch
// and writes its readings into the store.
func (s *Salvager) FromBackup(ctx context.Context, day buckets.Day, dir, scratch string) (int64, error) {
	m, err := backup.ReadManifest(dir)
	if err != nil {
		return 0, err
	}
	i := slices.IndexFunc(m.Tables, func(t backup.Table) bool { return t.Day == day.String() })
	if i < 0 {
		return 0, fmt.Errorf("its newest backup (%s) holds no table of %s", m.Created.UTC().Format(time.RFC3339), day)
	}
	for _, f := range m.Tables[i].Files {
		if !filepath.IsLocal(filepath.FromSlash(f.Path)) {
			return 0, fmt.Errorf("the manifest lists a file %q outside the backup directory", f.Path)
		}
		if err := backup.VerifyFile(dir, f); err != nil {
			return 0, err
		}
	}
	defer os.RemoveAll(scratch)
	create := func() (*badger.DB, error) { return s.Open(s.Options(scratch, false)) }
	if err := backup.LoadDB(ctx, dir, create, m.Tables[i].Files); err != nil {
		return 0, err
	}
	db, err := s.Open(s.Options(scratch, true))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var rep Report
	if err := s.copyBlocks(ctx, db, &rep); err != nil {
		return rep.Salvaged, err
	}
	return rep.Salvaged, nil
}

// Damaged writes what can be read of the damaged table in dir; readOnly
// opens it read-only (it was closed cleanly).
func (s *Salvager) Damaged(ctx context.Context, dir string, readOnly bool, rep *Report) error {
	opts := s.Options(dir, readOnly).WithChecksumVerificationMode(options.NoVerification)
	db, err := s.Open(opts)
	if err != nil {
		rep.SalvageErr = blocked.FirstLine(err.Error())
		s.Log.Warn("repair: the damaged table does not open even without checksum checks; reading its table files one by one",
			"dir", dir, "err", err)
		return s.salvageFiles(ctx, dir, opts, rep)
	}
	defer db.Close()
	return s.copyBlocks(ctx, db, rep)
}

// copyBlocks writes the readings of every sound block of db into the
// store, device by device, each device's blocks oldest version first.
// It counts them in rep.Salvaged.
func (s *Salvager) copyBlocks(ctx context.Context, db *badger.DB, rep *Report) error {
	var from []byte
	for {
		next, err := s.copyFrom(ctx, db, from, rep)
		if err != nil || next == nil {
			return err
		}
		from = next
	}
}

// copyFrom copies devices from the key from on. When Badger panics on
// a damaged part of the table, it returns the key to go on from: past
// the device it was reading, which is counted as skipped.
func (s *Salvager) copyFrom(ctx context.Context, db *badger.DB, from []byte, rep *Report) (next []byte, err error) {
	var dev buckets.DeviceID
	defer func() {
		if r := recover(); r != nil {
			rep.SkippedDevices++
			s.Log.Warn("repair: a damaged part of the table cannot be read; skipping to the next device",
				"device", string(dev), "panic", blocked.FirstLine(fmt.Sprint(r)))
			next, err = append([]byte(dev), '/'+1), nil
			if dev == "" {
				next = nil
			}
		}
	}()
	txn := db.NewTransactionAt(db.MaxVersion(), false)
	defer txn.Discard()
	it := txn.NewIterator(badger.IteratorOptions{})
	defer it.Close()
	var blocks []foundBlock
	for it.Seek(from); it.Valid(); it.Next() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		d, seq, ok := s.Blocks.ParseKey(it.Item().Key())
		if !ok {
			continue
		}
		if d != dev {
			if err := s.writeBlocks(ctx, blocks, rep); err != nil {
				return nil, err
			}
			blocks, dev = blocks[:0], d
		}
		if _, deleted := s.Store.DeletedAt(d); deleted {
			continue
		}
		var rs []buckets.Reading
		err := it.Item().Value(func(v []byte) error {
			var err error
			rs, err = s.Blocks.Decode(d, v)
			return err
		})
		if err != nil {
			rep.BadBlocks++
			continue
		}
		blocks = append(blocks, foundBlock{seq: seq, rs: rs})
	}
	return nil, s.writeBlocks(ctx, blocks, rep)
}

// foundBlock is a sound block of a table being repaired.
type foundBlock struct {
	seq uint64
	rs  []buckets.Reading
}

// writeBlocks writes the readings of one device's blocks, oldest
// version first, counting them in rep.Salvaged.
func (s *Salvager) writeBlocks(ctx context.Context, blocks []foundBlock, rep *Report) error {
	slices.SortFunc(blocks, func(a, b foundBlock) int { return cmpUint(a.seq, b.seq) })
	var batch []buckets.Reading
	write := func() error {
		if err := s.Store.Write(ctx, sortedByTicks(batch)); err != nil {
			return err
		}
		rep.Salvaged += int64(len(batch))
		batch = batch[:0]
		return nil
	}
	for _, b := range blocks {
		for _, r := range b.rs {
			batch = append(batch, r)
			if len(batch) == repairBatch {
				if err := write(); err != nil {
					return err
				}
			}
		}
	}
	if len(batch) > 0 {
		return write()
	}
	return nil
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sortedByTicks returns rs in the order Write wants within a device:
// a stable sort by device and time, so that of two readings with the
// same device and time the later one (a newer block's) comes last.
func sortedByTicks(rs []buckets.Reading) []buckets.Reading {
	slices.SortStableFunc(rs, func(a, b buckets.Reading) int {
		if a.Device != b.Device {
			if a.Device < b.Device {
				return -1
			}
			return 1
		}
		return cmpUint(uint64(a.Ticks), uint64(b.Ticks))
	})
	return rs
}

// When the damaged table does not open as a database at all (a table
// file's footer or index is damaged, so Badger refuses the whole
// directory), its table files are read one by one instead: every file
// that still opens gives its blocks, each checked by its own CRC-32C.
// A file is written oldest (lowest number) first and within it a
// device's blocks oldest version first, so where copies disagree the
// newer usually wins; readings merge by device and time either way. A
// memtable log not yet flushed into a table file is not read.

// Badger's entry meta bits (value.go in badger), which it does not
// export.
const (
	badgerBitDelete       = 1 << 0
	badgerBitValuePointer = 1 << 1
)

// salvageFiles writes the sound blocks of every table file in dir that
// opens, counting the files that do not in rep.SkippedFiles.
func (s *Salvager) salvageFiles(ctx context.Context, dir string, o badger.Options, rep *Report) error {
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return err
	}
	slices.SortFunc(ssts, func(a, b string) int {
		ia, _ := btable.ParseFileID(filepath.Base(a))
		ib, _ := btable.ParseFileID(filepath.Base(b))
		return cmpUint(ia, ib)
	})
	for _, path := range ssts {
		blocks, bad, err := s.readTableFile(path, o)
		rep.BadBlocks += bad
		if err != nil {
			rep.SkippedFiles++
			s.Log.Warn("repair: a table file of the damaged table cannot be read; skipping it", "file", path, "err", err)
			continue
		}
		for dev, bs := range blocks {
			if _, deleted := s.Store.DeletedAt(dev); deleted {
				continue
			}
			if err := s.writeBlocks(ctx, bs, rep); err != nil {
				return err
			}
		}
	}
	return nil
}

// readTableFile returns the sound blocks of the table file at path by
// device, and how many blocks failed their checksum. Badger panics on
// some kinds of damage; that is an error for this file.
func (s *Salvager) readTableFile(path string, o badger.Options) (blocks map[buckets.DeviceID][]foundBlock, bad int, err error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("map: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			blocks, err = nil, fmt.Errorf("damaged: %s", blocked.FirstLine(fmt.Sprint(r)))
		}
		_ = mf.Close(-1)
	}()
	tbl, err := btable.OpenTable(mf, btable.Options{ReadOnly: true, BlockSize: o.BlockSize,
		BloomFalsePositive: o.BloomFalsePositive, ChkMode: options.NoVerification,
		Compression: o.Compression, ZSTDCompressionLevel: o.ZSTDCompressionLevel})
	if err != nil {
		return nil, 0, err
	}
	it := tbl.NewIterator(0)
	defer it.Close()
	blocks = map[buckets.DeviceID][]foundBlock{}
	for it.Rewind(); it.Valid(); it.Next() {
		dev, seq, ok := s.Blocks.ParseKey(y.ParseKey(it.Key()))
		vs := it.Value()
		if !ok || vs.Meta&(badgerBitDelete|badgerBitValuePointer) != 0 {
			continue
		}
		rs, err := s.Blocks.Decode(dev, vs.Value)
		if err != nil {
			bad++
			continue
		}
		blocks[dev] = append(blocks[dev], foundBlock{seq: seq, rs: rs})
	}
	return blocks, bad, nil
}
