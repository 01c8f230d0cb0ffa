package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/blocked"
	"github.com/telemetryd/telemetryd/store/repair"
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

// RepairTable rebuilds the table of day (see Repair above).
func (s *Store) RepairTable(ctx context.Context, day buckets.Day, opts repair.Options) (repair.Report, error) {
	rep := repair.Report{Day: day}
	if s.opts.ReadOnly {
		return rep, fmt.Errorf("repair table %s: %w", day, errReadOnly)
	}
	prev := s.health.Get(day)
	s.health.Mark(s.log, day, blocked.Repairing, errors.New("being repaired"))
	var err error
	done := false
	defer func() {
		switch {
		case done:
		case rep.Damaged == "" && prev != nil: // the table is still there, as it was
			s.health.Restore(day, prev)
		default:
			s.health.Clear(s.log, day, "repair failed")
		}
	}()
	if rep.Damaged, err = s.moveAside(ctx, day); err != nil {
		return rep, fmt.Errorf("repair table %s: %w", day, err)
	}
	if opts.Backup != "" {
		n, err := s.salvager().FromBackup(ctx, day, opts.Backup, rep.Damaged+".backup")
		rep.FromBackup = n
		if err != nil {
			return rep, fmt.Errorf("repair table %s: from backup %s: %w", day, opts.Backup, err)
		}
	}
	if err := s.salvager().Damaged(ctx, rep.Damaged, badgeropts.ClosedCleanly(rep.Damaged), &rep); err != nil {
		return rep, fmt.Errorf("repair table %s: %w", day, err)
	}
	done = true
	s.health.Clear(s.log, day, "repaired")
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

// MarkReplay records that the stream's readings of day are to be
// replayed (by the service at its next start: PendingReplays).
func (s *Store) MarkReplay(day buckets.Day) error { return repair.Replays{Dir: s.dir}.Mark(day) }

// PendingReplays lists the days MarkReplay recorded.
func (s *Store) PendingReplays() []buckets.Day { return repair.Replays{Dir: s.dir}.Pending() }

// ClearReplay forgets day's pending replay.
func (s *Store) ClearReplay(day buckets.Day) error { return repair.Replays{Dir: s.dir}.Clear(day) }
