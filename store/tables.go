package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/telemetryd/telemetryd/buckets"
)

// tableDir is the directory of the table of day.
func (s *Store) tableDir(day buckets.Day) string {
	return TableDir(s.dir, day)
}

// Tables lists the day tables on disk, ascending by day. SizeBytes is
// the disk space of the table's files; Readings is the exact number of
// distinct readings, or -1 when it is not known. Tables never opens a
// table: the count of a table that is not open comes from its count
// file (see countfile.go), so it is -1 for a table that was being
// written when the process last stopped without closing it, until the
// table is opened again; and -1 for a table that cannot be opened.
func (s *Store) Tables(ctx context.Context) ([]buckets.TableInfo, error) {
	type listed struct {
		t      *table
		failed bool
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, errClosed
	}
	list := make([]listed, 0, len(s.tables))
	for _, t := range s.tables {
		if !t.dropping {
			list = append(list, listed{t: t, failed: t.failErr != nil})
		}
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b listed) int { return int(a.t.day - b.t.day) })

	infos := make([]buckets.TableInfo, 0, len(list))
	for _, l := range list {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n := l.t.readings.Load()
		if l.failed {
			n = -1
		}
		infos = append(infos, buckets.TableInfo{Day: l.t.day, SizeBytes: dirSize(l.t.dir), Readings: n})
	}
	return infos, nil
}

// DropTable drops the table of day: it stops routing reads and writes
// to it (later reads see an empty day, writes that race with the drop
// fail with buckets.ErrUnavailable, and a write after the drop creates
// a fresh table), waits for the calls that hold it, closes it and
// removes its directory. The directory is first renamed, so the cost
// does not depend on the number of readings and an interrupted removal
// is finished by the next Open. Reason is left empty for the caller.
// It wraps buckets.ErrNotFound when there is no such table.
func (s *Store) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	if s.opts.ReadOnly {
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w", day, errReadOnly)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return buckets.TableDrop{}, errClosed
	}
	t := s.tables[day]
	if t == nil {
		s.mu.Unlock()
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w", day, buckets.ErrNotFound)
	}
	if t.dropping {
		s.mu.Unlock()
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w: already being dropped", day, buckets.ErrUnavailable)
	}
	t.dropping = true
	s.inflight.Add(1)
	defer s.inflight.Done()
	if err := s.waitUnusedLocked(ctx, t); err != nil {
		t.dropping = false
		s.mu.Unlock()
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w", day, err)
	}
	db := t.db
	t.db = nil
	s.dropSeq++
	trash := filepath.Join(s.tablesDir, dropPrefix+day.String()+"-"+strconv.Itoa(s.dropSeq))
	s.mu.Unlock()
	s.recordTombstone(day)

	drop := buckets.TableDrop{Day: day, SizeBytes: dirSize(t.dir), Readings: t.readings.Load()}
	if db != nil {
		if err := db.Close(); err != nil {
			s.log.Error("close dropped table", "table", day.String(), "err", err)
		}
	}
	err := os.Rename(t.dir, trash)
	if err != nil && !os.IsNotExist(err) {
		s.mu.Lock()
		t.dropping = false // leave it in place; a later drop may succeed
		s.mu.Unlock()
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w", day, err)
	}
	s.mu.Lock()
	delete(s.tables, day)
	s.mu.Unlock()
	if err == nil {
		if err := os.RemoveAll(trash); err != nil {
			// The table is gone from the store; the next Open finishes.
			s.log.Error("remove dropped table directory", "table", day.String(), "dir", trash, "err", err)
		}
	}
	return drop, nil
}

// waitUnusedLocked waits, with s.mu held (released while waiting),
// until no call holds t and no open or close of it is under way.
func (s *Store) waitUnusedLocked(ctx context.Context, t *table) error {
	for t.refs > 0 || t.busy != nil {
		var err error
		if ch := t.busy; ch != nil {
			s.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				err = ctx.Err()
			}
			s.mu.Lock()
		} else {
			err = s.waitReleaseLocked(ctx, t)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
