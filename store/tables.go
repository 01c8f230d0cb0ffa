package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/blocked"
	"github.com/telemetryd/telemetryd/store/diskuse"
)

// Tables lists the day tables on disk, ascending by day. SizeBytes is
// the disk space of the table's files; Readings is the exact number of
// distinct readings, or -1 when it is not known. Tables never opens a
// table: the count of a table that is not open comes from its count
// file (package countfile), so it is -1 for a table that was being
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
		infos = append(infos, buckets.TableInfo{Day: l.t.day, SizeBytes: diskuse.Dir(l.t.dir), Readings: n})
	}
	return infos, nil
}

// DropTable drops the table of day: it stops routing reads and writes
// to it (later reads see an empty day, writes that race with the drop
// fail with buckets.ErrUnavailable, and a write after the drop creates
// a fresh table), waits for the calls that hold it to let go (the last
// of them closes it), and removes its directory. The directory is
// first renamed, so the cost does not depend on the number of readings
// and an interrupted removal is finished by the next Open. If ctx ends
// before the last holder let go, the table is kept and routed to
// again. Reason is left empty for the caller. It wraps
// buckets.ErrNotFound when there is no such table.
func (s *Store) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	if s.opts.ReadOnly {
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w", day, errReadOnly)
	}
	if err := s.rollBeforeDrop(ctx, day); err != nil {
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w", day, err)
	}
	t, last, ours, idle, err := s.doom(day)
	if err != nil {
		return buckets.TableDrop{}, err
	}
	defer s.inflight.Done()
	defer s.watch.Removed("")
	size := diskuse.Dir(t.dir) // what Tables said; closing changes it
	if idle != nil {
		s.endLogged(idle)
	}
	if err := s.waitDoomed(ctx, t, last, ours); err != nil {
		return buckets.TableDrop{}, fmt.Errorf("drop table %s: %w", day, err)
	}
	return s.removeTable(t, size, s.damaged(t))
}

// damaged reports whether t is a table that does not open: its last
// open failed, or it is blocked as damaged.
func (s *Store) damaged(t *table) bool {
	s.mu.Lock()
	failed := t.failErr != nil
	s.mu.Unlock()
	return failed || s.health.IsFor(t.day, blocked.Damaged)
}

// doom marks the table of day as being dropped and detaches its
// handle. It returns the table's newest handle, whose end the drop
// waits for, whether that is the handle it detached (ours), and the
// handle to end at once when the detach gave up its last reference.
// s.inflight counts the drop until it returns.
func (s *Store) doom(day buckets.Day) (t *table, last *handle, ours bool, idle *handle, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, nil, false, nil, errClosed
	}
	t = s.tables[day]
	if t == nil {
		return nil, nil, false, nil, fmt.Errorf("drop table %s: %w", day, buckets.ErrNotFound)
	}
	if t.dropping {
		return nil, nil, false, nil, fmt.Errorf("drop table %s: %w: already being dropped", day, buckets.ErrUnavailable)
	}
	t.dropping = true
	s.inflight.Add(1)
	if h := t.cur; h != nil { // then it is t.last too
		h.dropped = true
		ours = true
		if s.detach(h) {
			idle = h
		}
	}
	return t, t.last, ours, idle, nil
}

// waitDoomed waits for h, the newest handle of t (if any), to end. If
// ctx ends first, the drop is called off (callOff).
func (s *Store) waitDoomed(ctx context.Context, t *table, h *handle, ours bool) error {
	if h == nil {
		return nil
	}
	select {
	case <-h.ended:
		return nil
	case <-ctx.Done():
	}
	if !s.callOff(t, h, ours) {
		<-h.ended // it is ending: closing its database takes no holder
		return nil
	}
	return ctx.Err()
}

// callOff calls off the drop of t unless h, its newest handle, is
// already ending: t is routed to again, and h becomes its handle again
// if the drop detached it (ours) and it did not skip its open, so the
// readers that come meanwhile share it.
func (s *Store) callOff(t *table, h *handle, ours bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h.refs == 0 {
		return false
	}
	t.dropping = false
	if ours && !h.skipped && t.cur == nil {
		h.detached, h.dropped = false, false
		h.refs++
		t.cur = h
	}
	return true
}

// removeTable removes t, which is being dropped and has no handle, and
// whose files took size bytes: it records the tombstone, renames the directory away, forgets t and
// removes the renamed directory.
//
// A damaged table (one that does not open) gets no tombstone: its
// readings that wait in the stream, and those a replay of the stream
// delivers again, are written to a new table of the day instead of
// being skipped as day_dropped, since what it held is lost, not
// deliberately removed.
func (s *Store) removeTable(t *table, size int64, damaged bool) (buckets.TableDrop, error) {
	day := t.day
	if !damaged {
		s.recordTombstone(day)
	}
	drop := buckets.TableDrop{Day: day, SizeBytes: size, Readings: t.readings.Load()}
	s.mu.Lock()
	s.dropSeq++
	trash := filepath.Join(s.tablesDir, dropPrefix+day.String()+"-"+strconv.Itoa(s.dropSeq))
	s.mu.Unlock()
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
	if damaged {
		s.log.Warn("damaged day table dropped without a tombstone: the stream's readings of the day go into a new table",
			"day", day.String())
	}
	s.health.Clear(s.log, day, "dropped")
	if err == nil {
		if err := os.RemoveAll(trash); err != nil {
			// The table is gone from the store; the next Open finishes.
			s.log.Error("remove dropped table directory", "day", day.String(), "dir", trash, "err", err)
		}
	}
	return drop, nil
}
