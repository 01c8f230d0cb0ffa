package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// The cluster-wide device delete follows the day drop's protocol (see
// DropTable). DELETE /v1/devices/{device} through any node first
// records the delete with Members, then deletes the device on every
// live node (each records its own tombstone at its own time and removes
// its copy), then records that the delete has gone round. A node that
// was down or unreachable meanwhile reads the record and deletes the
// device when it is back (applyDeletes); and no partition consumer
// writes a reading or an attribute of the device from a message the
// stream stored before the later of the cluster-wide and its own delete
// (Tombstones), a new owner replaying the stream included.

// DeleteDevice deletes dev on every live node and records the delete
// cluster-wide, so the nodes that did not answer apply it later. The
// error wraps buckets.ErrNotFound when no node knew the device; then
// nothing is recorded.
func (n *Node) DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	out := buckets.DeviceDelete{Device: dev, Readings: -1}
	if n.cfg.Everywhere == nil {
		return out, errors.New("cluster: no way to reach the other nodes")
	}
	at := n.cfg.Now()
	if err := n.cfg.Members.RecordDelete(ctx, dev, at, false); err != nil {
		return out, fmt.Errorf("device %s: %w: %w", dev, err, buckets.ErrUnavailable)
	}
	d, err := n.cfg.Everywhere.DeleteDevice(ctx, dev)
	if errors.Is(err, buckets.ErrNotFound) {
		// No node knew it: it stays recorded (harmless: it only keeps
		// messages stored before now from writing the device, which
		// no node holds), and is reported as unknown.
		n.log.Debug("device deleted cluster-wide was known to no node", "device", string(dev))
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), n.cfg.CallTimeout)
	defer cancel()
	if rerr := n.cfg.Members.RecordDelete(rctx, dev, at, true); rerr != nil {
		n.log.Warn("record a cluster-wide device delete as gone round", "device", string(dev), "err", rerr)
	}
	return d, err
}

// applyDeletes deletes the devices deleted cluster-wide that this node
// still holds without a delete of its own since: it was down or
// unreachable when the DELETE went round.
func (n *Node) applyDeletes(ctx context.Context) {
	for dev, at := range n.cfg.Members.Deletes() {
		if own, ok := n.cfg.Store.DeletedAt(dev); ok && !own.Before(at.Add(-DropSkew)) {
			continue
		}
		d, err := n.cfg.Store.DeleteDevice(ctx, dev)
		switch {
		case errors.Is(err, buckets.ErrNotFound): // holds nothing of it
		case err != nil:
			n.log.Warn("delete a device deleted cluster-wide while this node was away", "device", string(dev), "err", err)
		default:
			n.log.Info("deleted a device deleted cluster-wide while this node was away", "device", string(dev),
				"deleted_cluster_wide", at, "readings", d.Readings)
		}
	}
}

// DeletedAt is the later of the two deletes of dev.
func (t Tombstones) DeletedAt(dev buckets.DeviceID) (time.Time, bool) {
	a, okA := t.Local.DeletedAt(dev)
	b, okB := t.Cluster.DeletedAt(dev)
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
