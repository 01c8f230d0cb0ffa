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
// records the delete with Members, stamped with the wall clock (it is
// compared with the time the NATS server stored each message), then
// deletes the device on every live node (each records its own
// tombstone at its own time and removes its copy), then records that
// the delete has gone round. A node that was down, unreachable or not
// yet a member reads the record and, at the start of its next Step,
// before it starts any consumer, records the tombstone at the
// cluster-wide time and deletes what it holds of the device
// (applyDeletes). No partition consumer writes a reading or an
// attribute of the device from a message the stream stored before the
// later of the cluster-wide and its own delete (Tombstones), a new
// owner replaying the stream included; what the device publishes after
// the delete is stored.

// DeleteDevice deletes dev on every live node and records the delete
// cluster-wide, so the nodes that did not answer apply it later. The
// error wraps buckets.ErrNotFound when no node knew the device; then
// nothing is recorded.
func (n *Node) DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error) {
	out := buckets.DeviceDelete{Device: dev, Readings: -1}
	if n.cfg.Everywhere == nil {
		return out, errors.New("cluster: no way to reach the other nodes")
	}
	at := time.Now()
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

// applyDeletes applies the devices deleted cluster-wide without a
// delete of this node's own since: it was down, unreachable or not a
// member when the DELETE went round. The store records the tombstone
// at the cluster-wide time (known device or not, so this is done once)
// and deletes what it holds of the device.
func (n *Node) applyDeletes(ctx context.Context) {
	for dev, at := range n.cfg.Members.Deletes() {
		if own, ok := n.cfg.Store.DeletedAt(dev); ok && !own.Before(at.Add(-DropSkew)) {
			continue
		}
		d, err := n.cfg.Store.DeleteDeviceAt(ctx, dev, at)
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
	return later(a, okA, b, okB)
}
