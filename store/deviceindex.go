package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/badgeropts"
	"github.com/telemetryd/telemetryd/store/devindex"
	"github.com/telemetryd/telemetryd/store/storemetrics"
)

// openIndex opens the device index database in dir and loads the index
// (store/devindex).
func openIndex(dir string, syncWrites, readOnly bool, log *slog.Logger) (*devindex.Index, error) {
	db, err := badgeropts.OpenView(badgeropts.For(dir, badgeropts.Index, syncWrites, readOnly, log.With("db", "index")), badgeropts.Open)
	if err != nil {
		return nil, fmt.Errorf("open device index: %w", err)
	}
	idx, err := devindex.Load(db, readOnly, log)
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	return idx, nil
}

// closeIndex persists the index's pending updates and closes its
// database.
func closeIndex(x *devindex.Index) error {
	ferr := x.Flush()
	if err := x.DB().Close(); err != nil {
		return errors.Join(ferr, fmt.Errorf("close device index: %w", err))
	}
	badgeropts.ReleaseView(x.DB())
	return ferr
}

// checkIndex checks the device index database into rep: its device
// records, its attribute records and the index entities.
func (s *Store) checkIndex(rep *CheckReport) error {
	res, err := s.index.Check()
	rep.RecordsRead += res.RecordsRead
	for _, d := range res.Bad {
		rep.Records = append(rep.Records, BadRecord{Device: d.Device, Err: d.Err})
	}
	rep.AttributeRecordsRead += res.AttributeRecordsRead
	rep.EntitiesRead += res.EntitiesRead
	rep.MissingEntities += res.MissingEntities
	rep.StrayEntities += res.StrayEntities
	return err
}

// damagedAttrRecords counts the attribute records load rebuilt (it has
// logged them).
func (b *badBlocks) damagedAttrRecords(recs []devindex.Damaged) {
	for range recs {
		b.counter.Add(context.Background(), 1, storemetrics.KindRecord)
	}
}

// Assign applies attribute assignments to the device index
// (devindex.Index.Assign says how the newest assignment wins). Invalid
// assignments are refused with a *buckets.ValidationError and nothing
// of as is applied.
func (s *Store) Assign(ctx context.Context, as []buckets.Assignment) error {
	if len(as) == 0 {
		return ctx.Err()
	}
	if s.opts.ReadOnly {
		return errReadOnly
	}
	if err := devindex.Validate(as); err != nil {
		return err
	}
	if err := s.Ping(ctx); err != nil {
		return err
	}
	return classify(s.index.Assign(as))
}

// Device returns what the index knows about dev, with its attributes;
// buckets.ErrNotFound if it knows nothing.
func (s *Store) Device(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceInfo, error) {
	if err := s.Ping(ctx); err != nil {
		return buckets.DeviceInfo{}, err
	}
	return s.index.Device(dev)
}

// Devices lists the known devices q selects, sorted by ID, at most
// q.Limit of them; more is true when further devices match
// (devindex.Index.Devices).
func (s *Store) Devices(ctx context.Context, q buckets.DeviceQuery) (infos []buckets.DeviceInfo, more bool, err error) {
	if q.Limit <= 0 {
		return s.index.Devices(ctx, q) // refuses the limit
	}
	if err := s.Ping(ctx); err != nil {
		return nil, false, err
	}
	return s.index.Devices(ctx, q)
}

// AttributeNames returns the attribute names, sorted, among the devices
// q selects (devindex.Index.AttributeNames).
func (s *Store) AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error) {
	if err := s.Ping(ctx); err != nil {
		return nil, err
	}
	return s.index.AttributeNames(ctx, q)
}

// AttributeGeneration counts the changes of devices' attribute sets
// (devindex.Index.AttributeGeneration), so that an answer kept beside
// the store can tell that its series labels are stale.
func (s *Store) AttributeGeneration() uint64 { return s.index.AttributeGeneration() }

// AttributeValues returns the values of the attribute name, sorted,
// among the devices q selects (devindex.Index.AttributeValues).
func (s *Store) AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error) {
	if err := s.Ping(ctx); err != nil {
		return nil, err
	}
	return s.index.AttributeValues(ctx, name, q)
}

// AttributeState returns assignments that rebuild the attribute state
// of the devices keep selects, from the first device after after, at
// most limit devices (devindex.Index.AttributeState).
func (s *Store) AttributeState(ctx context.Context, after buckets.DeviceID, limit int, keep func(buckets.DeviceID) bool) ([]buckets.Assignment, buckets.DeviceID, bool, error) {
	if err := s.Ping(ctx); err != nil {
		return nil, "", false, err
	}
	as, next, more := s.index.AttributeState(after, limit, keep)
	return as, next, more, nil
}
