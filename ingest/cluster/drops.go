package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// The cluster-wide drop. DELETE /v1/tables/{day} through any node
// (DropTable) first records the drop with Members (in a key-value
// bucket every node reads), then drops the day on every live node
// (Config.Everywhere), then records that the drop has gone round. A
// node that was down or unreachable meanwhile reads the record and
// drops the day when it is back (applyDrops), once the drop has gone
// round, so it never races with the DELETE; and no partition consumer
// writes a reading of the day from a message the stream stored before
// the drop (Tombstones), a new owner replaying the stream included.

// DropSkew is how much earlier than the cluster-wide record a node's
// own drop of a day may be stamped (the nodes' clocks differ) and still
// count as that drop.
const DropSkew = time.Minute

// DropTable drops day on every live node and records the drop
// cluster-wide, so the nodes that did not answer apply it later.
func (n *Node) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	if n.cfg.Everywhere == nil {
		return buckets.TableDrop{Day: day, Readings: -1}, errors.New("cluster: no way to reach the other nodes")
	}
	at := n.cfg.Now()
	if err := n.cfg.Members.RecordDrop(ctx, day, at, false); err != nil {
		return buckets.TableDrop{Day: day, Readings: -1}, fmt.Errorf("table %s: %w: %w", day, err, buckets.ErrUnavailable)
	}
	d, err := n.cfg.Everywhere.DropTable(ctx, day)
	// Gone round: the nodes that did not answer may now apply it. (If
	// this fails, they do after the record's wait.)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.cfg.CallTimeout)
	defer cancel()
	if rerr := n.cfg.Members.RecordDrop(rctx, day, at, true); rerr != nil {
		n.log.Warn("record a cluster-wide drop as gone round", "day", day.String(), "err", rerr)
	}
	return d, err
}

// applyDrops drops the days dropped cluster-wide that this node still
// holds without a drop of its own since: it was down or unreachable
// when the DELETE went round.
func (n *Node) applyDrops(ctx context.Context) {
	for day, at := range n.cfg.Members.Drops() {
		if own, ok := n.cfg.Store.DroppedAt(day); ok && !own.Before(at.Add(-DropSkew)) {
			continue
		}
		d, err := n.cfg.Store.DropTable(ctx, day)
		switch {
		case errors.Is(err, buckets.ErrNotFound), errors.Is(err, buckets.ErrUnavailable): // none, or being dropped
		case err != nil:
			n.log.Warn("drop a day dropped cluster-wide while this node was away", "day", day.String(), "err", err)
		default:
			n.cfg.Dropped(ctx, d)
			n.log.Info("dropped a day dropped cluster-wide while this node was away", "day", day.String(),
				"dropped_cluster_wide", at, "size_bytes", d.SizeBytes)
		}
	}
}

// LocalTombstones is the store's own record of dropped days
// (ingest.Tombstones, met by store.Store).
type LocalTombstones interface {
	DroppedAt(day buckets.Day) (time.Time, bool)
	DeletedAt(dev buckets.DeviceID) (time.Time, bool)
	HoldDrops() (release func())
}

// Tombstones are the store's tombstones and the cluster-wide drops
// together, for a partition consumer (ingest.Config.Tombstones): it
// skips a reading of a day dropped by either after its message was
// stored, so a node that replays the stream (a new owner, or one back
// from an outage) does not write a day dropped cluster-wide again.
type Tombstones struct {
	Local   LocalTombstones
	Cluster interface {
		DroppedAt(day buckets.Day) (time.Time, bool)
		DeletedAt(dev buckets.DeviceID) (time.Time, bool)
	}
}

// DroppedAt is the later of the two drops of day.
func (t Tombstones) DroppedAt(day buckets.Day) (time.Time, bool) {
	a, okA := t.Local.DroppedAt(day)
	b, okB := t.Cluster.DroppedAt(day)
	return later(a, okA, b, okB)
}

// later is the later of two optional times.
func later(a time.Time, okA bool, b time.Time, okB bool) (time.Time, bool) {
	switch {
	case okA && okB:
		if b.After(a) {
			return b, true
		}
		return a, true
	case okB:
		return b, true
	}
	return a, okA
}

// HoldDrops holds the store's drops.
func (t Tombstones) HoldDrops() (release func()) { return t.Local.HoldDrops() }
