package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"

	"github.com/telemetryd/telemetryd/buckets"
)

// Repair rebuilds a damaged day table (one that does not open) from
// what can still be read of it and, when given, a backup:
//
//  1. The table is taken out of service as a drop does (readers and
//     writers let go of it first) and its directory is moved to
//     <data-dir>/damaged/<day>-<unix time>, kept for the operator to
//     look at or remove. The day stays blocked (health.go): intake
//     stays paused, so nothing newer is written before the rebuild.
//  2. From the backup's newest manifest, the day's files are checked
//     against their SHA-256 and loaded into a scratch database, whose
//     readings are written into a new table of the day.
//  3. The damaged copy is opened without Badger's checksum checks and
//     every block whose own CRC-32C holds is written into the new
//     table, a device's blocks oldest version first, so where blocks
//     disagree the newest wins as it did. A device whose reading
//     Badger cannot read (a panic on a damaged file) is skipped from
//     there and counted; devices deleted are left out.
//  4. The day is unblocked: intake resumes, and the readings that
//     waited in the stream are written on top. What else the stream
//     still holds of the day is the caller's to replay (the service
//     does, package ingest's ReplayDay): a replay writes nothing twice.
//
// Readings merge by device and time, later writes winning per value
// name, which gives the order above: backup, damaged copy, stream.

// damagedDirName holds the directories of repaired tables.
const damagedDirName = "damaged"

// repairBatch is how many readings a repair writes at once.
const repairBatch = buckets.MaxBatch

// RepairOptions configures RepairTable.
type RepairOptions struct {
	// Backup, when set, is a backup directory (Backup's) whose newest
	// manifest's copy of the day is loaded first.
	Backup string
}

// RepairReport is what RepairTable did.
type RepairReport struct {
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

// RepairTable rebuilds the table of day (see Repair above).
func (s *Store) RepairTable(ctx context.Context, day buckets.Day, opts RepairOptions) (RepairReport, error) {
	rep := RepairReport{Day: day}
	if s.opts.ReadOnly {
		return rep, fmt.Errorf("repair table %s: %w", day, errReadOnly)
	}
	prev := s.blockedState(day)
	s.block(day, blockedRepairing, errors.New("being repaired"))
	var err error
	done := false
	defer func() {
		switch {
		case done:
		case rep.Damaged == "" && prev != nil: // the table is still there, as it was
			s.restoreBlocked(day, prev)
		default:
			s.unblock(day, "repair failed")
		}
	}()
	if rep.Damaged, err = s.moveAside(ctx, day); err != nil {
		return rep, fmt.Errorf("repair table %s: %w", day, err)
	}
	if opts.Backup != "" {
		n, err := s.repairFromBackup(ctx, day, opts.Backup, rep.Damaged+".backup")
		rep.FromBackup = n
		if err != nil {
			return rep, fmt.Errorf("repair table %s: from backup %s: %w", day, opts.Backup, err)
		}
	}
	if err := s.salvage(ctx, rep.Damaged, &rep); err != nil {
		return rep, fmt.Errorf("repair table %s: %w", day, err)
	}
	done = true
	s.unblock(day, "repaired")
	s.log.Warn("day table repaired", "day", day.String(), "from_backup", rep.FromBackup, "salvaged", rep.Salvaged,
		"bad_blocks", rep.BadBlocks, "skipped_devices", rep.SkippedDevices, "skipped_files", rep.SkippedFiles, "salvage_error", rep.SalvageErr,
		"damaged_copy", rep.Damaged)
	return rep, nil
}

// moveAside takes the table of day out of service as a drop does and
// moves its directory under damagedDirName, returning where.
func (s *Store) moveAside(ctx context.Context, day buckets.Day) (string, error) {
	t, last, ours, idle, err := s.doom(day)
	if err != nil {
		return "", err
	}
	defer s.inflight.Done()
	if idle != nil {
		s.endLogged(idle)
	}
	if err := s.waitDoomed(ctx, t, last, ours); err != nil {
		return "", err
	}
	to := filepath.Join(s.dir, damagedDirName, day.String()+"-"+strconv.FormatInt(time.Now().Unix(), 10))
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		s.undoom(t)
		return "", err
	}
	if err := os.Rename(t.dir, to); err != nil && !os.IsNotExist(err) {
		s.undoom(t)
		return "", fmt.Errorf("move it aside: %w", err)
	}
	s.mu.Lock()
	delete(s.tables, day)
	s.mu.Unlock()
	s.log.Warn("repairing day table: the damaged one was moved aside", "day", day.String(), "moved_to", to)
	return to, nil
}

// undoom puts back a table whose repair stopped before it moved it.
func (s *Store) undoom(t *table) {
	s.mu.Lock()
	t.dropping = false
	s.mu.Unlock()
}

// repairFromBackup loads the day's copy in the backup dir into scratch
// and writes its readings into the store.
func (s *Store) repairFromBackup(ctx context.Context, day buckets.Day, dir, scratch string) (int64, error) {
	m, err := readManifest(dir)
	if err != nil {
		return 0, err
	}
	i := slices.IndexFunc(m.Tables, func(t BackupTable) bool { return t.Day == day.String() })
	if i < 0 {
		return 0, fmt.Errorf("its newest backup (%s) holds no table of %s", m.Created.UTC().Format(time.RFC3339), day)
	}
	for _, f := range m.Tables[i].Files {
		if !filepath.IsLocal(filepath.FromSlash(f.Path)) {
			return 0, fmt.Errorf("the manifest lists a file %q outside the backup directory", f.Path)
		}
		if err := verifyFile(dir, f); err != nil {
			return 0, err
		}
	}
	defer os.RemoveAll(scratch)
	if err := loadDB(ctx, dir, badgerOptions(scratch, classCold, false, false, s.log), openTableBadger, m.Tables[i].Files); err != nil {
		return 0, err
	}
	db, err := openTableBadger(badgerOptions(scratch, classCold, false, true, s.log))
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var rep RepairReport
	if err := s.copyBlocks(ctx, db, &rep); err != nil {
		return rep.Salvaged, err
	}
	return rep.Salvaged, nil
}

// salvage writes what can be read of the damaged table in dir.
func (s *Store) salvage(ctx context.Context, dir string, rep *RepairReport) error {
	opts := badgerOptions(dir, classCold, false, closedCleanly(dir), s.log).
		WithChecksumVerificationMode(options.NoVerification)
	db, err := openTableBadger(opts)
	if err != nil {
		rep.SalvageErr = firstLine(err.Error())
		s.log.Warn("repair: the damaged table does not open even without checksum checks; reading its table files one by one",
			"dir", dir, "err", err)
		return s.salvageFiles(ctx, dir, opts, rep)
	}
	defer db.Close()
	return s.copyBlocks(ctx, db, rep)
}

// copyBlocks writes the readings of every sound block of db into the
// store, device by device, each device's blocks oldest version first.
// It counts them in rep.Salvaged.
func (s *Store) copyBlocks(ctx context.Context, db *badger.DB, rep *RepairReport) error {
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
func (s *Store) copyFrom(ctx context.Context, db *badger.DB, from []byte, rep *RepairReport) (next []byte, err error) {
	var dev buckets.DeviceID
	defer func() {
		if r := recover(); r != nil {
			rep.SkippedDevices++
			s.log.Warn("repair: a damaged part of the table cannot be read; skipping to the next device",
				"device", string(dev), "panic", firstLine(fmt.Sprint(r)))
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
		d, ref, ok := parseAnyBlockKey(it.Item().Key())
		if !ok {
			continue
		}
		if d != dev {
			if err := s.writeBlocks(ctx, blocks, rep); err != nil {
				return nil, err
			}
			blocks, dev = blocks[:0], d
		}
		if _, deleted := s.DeletedAt(d); deleted {
			continue
		}
		rs, err := decodeItem(blockItem{ref: ref, item: it.Item()}, d)
		if err != nil {
			rep.BadBlocks++
			continue
		}
		blocks = append(blocks, foundBlock{seq: ref.seq, rs: rs})
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
func (s *Store) writeBlocks(ctx context.Context, blocks []foundBlock, rep *RepairReport) error {
	slices.SortFunc(blocks, func(a, b foundBlock) int { return cmpUint(a.seq, b.seq) })
	var batch []buckets.Reading
	write := func() error {
		if err := s.Write(ctx, sortedByTicks(batch)); err != nil {
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

// replayFileName lists the days repaired while the service was stopped
// whose stream readings the service replays at its next start.
const replayFileName = "REPLAY"

// MarkReplay records that the stream's readings of day are to be
// replayed (by the service at its next start: PendingReplays).
func (s *Store) MarkReplay(day buckets.Day) error {
	days := s.PendingReplays()
	if !slices.Contains(days, day) {
		days = append(days, day)
	}
	return s.saveReplays(days)
}

// PendingReplays lists the days MarkReplay recorded.
func (s *Store) PendingReplays() []buckets.Day {
	b, err := os.ReadFile(filepath.Join(s.dir, replayFileName))
	if err != nil {
		return nil
	}
	var days []buckets.Day
	for _, f := range strings.Fields(string(b)) {
		if d, err := buckets.ParseDay(f); err == nil {
			days = append(days, d)
		}
	}
	return days
}

// ClearReplay forgets day's pending replay.
func (s *Store) ClearReplay(day buckets.Day) error {
	return s.saveReplays(slices.DeleteFunc(s.PendingReplays(), func(d buckets.Day) bool { return d == day }))
}

func (s *Store) saveReplays(days []buckets.Day) error {
	if len(days) == 0 {
		err := os.Remove(filepath.Join(s.dir, replayFileName))
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	var b strings.Builder
	for _, d := range days {
		b.WriteString(d.String() + "\n")
	}
	return replaceFile(s.dir, replayFileName, []byte(b.String()))
}
