// Package cluster answers the API's queries in a cluster of telemetryd
// nodes (deploy/CLUSTER.md), where each node stores the devices of the
// partitions it owns.
//
// Router implements the readers the API is built on (api.Reader,
// api.Aggregator, promapi.Source) and the cluster-wide table drop, so
// every endpoint, cursor, aggregate and PromQL query works unchanged on
// any node:
//
//   - a single-device call (latest, range, point, aggregates) is
//     answered from the local store when this node has caught up on the
//     device's partition, otherwise by an owner over the node-to-node
//     API, trying the next owner when one fails or refuses;
//   - a device's record (with its attributes) comes from an owner of
//     its partition, like a single-device call;
//   - the device list (filtered by attributes and silence too) and the
//     attribute names and values ask one owner per partition, each for
//     the devices of the partitions it was chosen for, and merge the
//     sorted answers; PromQL reads its series through the same calls,
//     and the Prometheus engine evaluates on the merged series. The
//     answering node applies the caller's device patterns itself;
//   - an attribute write goes to every node holding the device's
//     partition, caught up or not (each keeps its own index, and any
//     of them may answer a later read), and succeeds when all of them
//     applied it (Router.Assign); a node that starts holding a
//     partition copies its attribute state from an owner before it
//     answers for it (Router.CopyAttributes), since the stream does
//     not carry these writes;
//   - the table list and DELETE /v1/tables/{day} go to every live node.
//
// Cursors hold only query parameters and positions in the data, which
// are the same on every copy; with the same cursor key on every node
// (-cursor-key, the same on every node) a cursor made by one
// node continues on any other.
//
// A node answers for a partition only while it serves it by its own
// state (Config.Serves): the leases another node read may still list it
// as an owner after it handed the partition back or withdrew it as
// trailing its stream, and its copy then misses what came since. Such
// a node refuses (503, code not_serving, naming the partitions), and
// the asking node asks the partition's next owner; this node skips its
// own copy the same way. When no owner serves a partition the answer
// is an *UnavailableError naming it. An answer read from an owner's
// copy that trails its stream carries a warning naming the partition
// (PartialWarning, partial.go).
//
// Handler serves the node-to-node API from the local store. Every call
// carries the cluster credential, which clients do not have, and the
// name of the client token it serves; the answering node gives that
// token the rights the public endpoints give it (scopes and device
// patterns), so a node-to-node call can do nothing its client could
// not. The API does not count such calls against any client's rate
// limit: the client's own request was counted where it arrived. The one
// call a node makes on its own behalf, serving no client, copies a
// partition's attribute state (attrstate.go); it needs the credential
// and can ask nothing else.
package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// Local is this node's store.
type Local interface {
	Latest(ctx context.Context, dev buckets.DeviceID, n int) ([]buckets.Reading, error)
	Range(ctx context.Context, q buckets.RangeQuery) (buckets.Page, error)
	Get(ctx context.Context, dev buckets.DeviceID, k buckets.Ticks) (buckets.Reading, error)
	Devices(ctx context.Context, q buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error)
	Tables(ctx context.Context) ([]buckets.TableInfo, error)
	Aggregate(ctx context.Context, q buckets.AggregateQuery) (buckets.AggregatePage, error)
	DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error)
	DeleteDevice(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceDelete, error)
	Device(ctx context.Context, dev buckets.DeviceID) (buckets.DeviceInfo, error)
	Assign(ctx context.Context, as []buckets.Assignment) error
	AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error)
	AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error)
	// AttributeState lists assignments that rebuild the attribute state
	// of the devices keep selects, from after on, at most limit devices.
	AttributeState(ctx context.Context, after buckets.DeviceID, limit int, keep func(buckets.DeviceID) bool) ([]buckets.Assignment, buckets.DeviceID, bool, error)
}

// Peer is a node that answers for a partition.
type Peer struct {
	Node string
	URL  string
	Self bool
}

// Membership is what the router needs to know of the cluster.
type Membership interface {
	// Partitions is the partition count.
	Partitions() int
	// PartitionOf is the partition of a device.
	PartitionOf(dev buckets.DeviceID) int
	// Owners lists the nodes caught up on partition p, in the order
	// to ask them (this node first when it is one).
	Owners(p int) []Peer
	// Holders lists the nodes consuming partition p, caught up or
	// not: the caught-up owners, those still catching up on it and
	// those trailing its stream (withdrawn from Owners until they are
	// back within their bound), in no particular order.
	Holders(p int) []Peer
	// Nodes lists every live node.
	Nodes() []Peer
}

// Config configures a Router.
type Config struct {
	Local      Local
	Membership Membership
	// Credential is the cluster credential: the secret every node
	// presents to the others' node-to-node API and requires of calls
	// to its own. Required.
	Credential string
	// Callers looks up the token a node-to-node call serves; nil when
	// this node has no authentication.
	Callers Callers
	// HTTPClient makes node-to-node calls; default NewHTTPClient().
	HTTPClient *http.Client
	// Dropped is told of each day this node's store dropped for a
	// cluster-wide drop (for metrics); optional.
	Dropped func(ctx context.Context, d buckets.TableDrop)
	// Serves reports whether this node serves a partition's reads now,
	// by its own state: it consumes the partition, has caught up on it
	// and does not trail its stream (ingest/cluster Node.Serves). A
	// read of the partition, asked by this node or by another, is
	// answered from this node's copy only then; otherwise the next
	// owner is asked. Nil: every partition.
	Serves func(partition int) bool
	// Trailing reports whether this node's copy of a partition it
	// serves trails its stream (ingest/cluster Node.Trailing): answers
	// read from it carry PartialWarning. Nil: none does.
	Trailing func(partition int) bool
	Logger   *slog.Logger
}

// ConnsPerNode bounds the connections one node keeps to another. They
// are kept alive and reused, so node-to-node calls open few new
// connections, and several nodes behind one address stay within the
// API's per-address connection limit (64 by default): those limits
// apply before any credential is seen.
const ConnsPerNode = 16

// NewHTTPClient is the default client of node-to-node calls: a 30 s
// timeout and at most ConnsPerNode connections to each node. Nodes
// serving HTTPS need certificates the system roots trust.
func NewHTTPClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxConnsPerHost = ConnsPerNode
	t.MaxIdleConnsPerHost = ConnsPerNode
	return &http.Client{Timeout: 30 * time.Second, Transport: t}
}

// countingLocal tells Config.Dropped of each day the local store drops,
// whether for this node's router or for another node's call.
type countingLocal struct {
	Local
	dropped func(ctx context.Context, d buckets.TableDrop)
}

func (l countingLocal) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	d, err := l.Local.DropTable(ctx, day)
	if err == nil {
		l.dropped(ctx, d)
	}
	return d, err
}

// Router answers queries from the owners of each device.
type Router struct {
	local    Local
	members  Membership
	c        client
	callers  Callers
	serves   func(partition int) bool // Config.Serves; nil: every partition
	trailing func(partition int) bool // Config.Trailing; nil: none
	log      *slog.Logger
}

// New returns a Router.
func New(cfg Config) (*Router, error) {
	if cfg.Local == nil || cfg.Membership == nil {
		return nil, errors.New("cluster: Local and Membership are required")
	}
	if cfg.Credential == "" {
		return nil, errors.New("cluster: the cluster credential is required")
	}
	hc := cfg.HTTPClient
	if hc == nil {
		hc = NewHTTPClient()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	local := cfg.Local
	if cfg.Dropped != nil {
		local = countingLocal{Local: local, dropped: cfg.Dropped}
	}
	return &Router{local: local, members: cfg.Membership, c: client{http: hc, credential: cfg.Credential},
		callers: cfg.Callers, serves: cfg.Serves, trailing: cfg.Trailing, log: log}, nil
}

// Handler returns the node-to-node API of this node's store; it
// answers only for the partitions Config.Serves says this node serves.
func (r *Router) Handler() *Handler {
	h := NewHandler(r.local, r.members.PartitionOf, r.c.credential, r.callers, r.log)
	h.serves, h.trailing = r.serves, r.trailing
	return h
}

// servesHere reports whether this node serves partition p now.
func (r *Router) servesHere(p int) bool { return r.serves == nil || r.serves(p) }

// errNotServing is this node's refusal to read a partition from its own
// copy: it does not serve it now, whatever the leases say.
func errNotServing(p int) error {
	return fmt.Errorf("this node does not serve partition %d now (handed over, or trailing its stream): %w", p, buckets.ErrUnavailable)
}

// UnavailableError is a request for a partition that no owner
// answered: none has caught up on it yet, or every one failed. Its
// ClientMessage names the partition (not the nodes) for the client.
type UnavailableError struct {
	Partition int
	Errs      []error // what the owners asked answered; none: no owner caught up
}

// unavailable is the error when no owner of a partition answered.
func unavailable(p int, errs []error) error { return &UnavailableError{Partition: p, Errs: errs} }

func (e *UnavailableError) Error() string {
	if len(e.Errs) == 0 {
		return fmt.Sprintf("partition %d has no caught-up owner yet: %v", e.Partition, buckets.ErrUnavailable)
	}
	return fmt.Sprintf("partition %d: every owner failed: %v: %v", e.Partition, errors.Join(e.Errs...), buckets.ErrUnavailable)
}

// Unwrap matches buckets.ErrUnavailable and the owners' errors.
func (e *UnavailableError) Unwrap() []error {
	return append([]error{buckets.ErrUnavailable}, e.Errs...)
}

// ClientMessage is what a client is told.
func (e *UnavailableError) ClientMessage() string {
	if len(e.Errs) == 0 {
		return fmt.Sprintf("partition %d has no caught-up owner yet; retry later", e.Partition)
	}
	return fmt.Sprintf("partition %d: no owner answered (%d asked); retry later", e.Partition, len(e.Errs))
}

// onOwner runs local or remote against the owners of dev's partition in
// turn until one answers (a not-found or invalid-argument answer is an
// answer).
func (r *Router) onOwner(ctx context.Context, dev buckets.DeviceID, local func() error, remote func(base string) error) error {
	p := r.members.PartitionOf(dev)
	var errs []error
	for _, o := range r.members.Owners(p) {
		if o.Self {
			if !r.servesHere(p) { // the leases are older than this node's own state
				errs = append(errs, errNotServing(p))
				continue
			}
			// This node's copy may be unavailable (a table being
			// repaired, a store refusing while its disk is full); the
			// next owner's may not.
			err := local()
			if err == nil || !errors.Is(err, buckets.ErrUnavailable) || ctx.Err() != nil {
				r.warnTrailing(ctx, p)
				return err
			}
			r.log.WarnContext(ctx, "own copy unavailable; trying the next owner", "partition", p, "err", err)
			errs = append(errs, err)
			continue
		}
		err := remote(o.URL)
		if err == nil || !errors.Is(err, errTransport) {
			return err
		}
		r.log.WarnContext(ctx, "owner did not answer; trying the next", "partition", p, "node", o.Node, "err", err)
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return unavailable(p, errs)
}

// Latest implements api.Reader.
func (r *Router) Latest(ctx context.Context, dev buckets.DeviceID, n int) (rs []buckets.Reading, err error) {
	err = r.onOwner(ctx, dev,
		func() (err error) { rs, err = r.local.Latest(ctx, dev, n); return err },
		func(base string) error {
			var out readingsResponse
			if err := r.c.call(ctx, base, pathLatest, latestRequest{Device: dev, N: n}, &out); err != nil {
				return err
			}
			rs, err = fromWire(out.Readings)
			return err
		})
	return rs, err
}

// Range implements api.Reader and promapi.Source.
func (r *Router) Range(ctx context.Context, q buckets.RangeQuery) (p buckets.Page, err error) {
	err = r.onOwner(ctx, q.Device,
		func() (err error) { p, err = r.local.Range(ctx, q); return err },
		func(base string) error {
			var out readingsResponse
			if err := r.c.call(ctx, base, pathRange, q, &out); err != nil {
				return err
			}
			p.More = out.More
			p.Readings, err = fromWire(out.Readings)
			return err
		})
	return p, err
}

// Get implements api.Reader.
func (r *Router) Get(ctx context.Context, dev buckets.DeviceID, k buckets.Ticks) (rd buckets.Reading, err error) {
	err = r.onOwner(ctx, dev,
		func() (err error) { rd, err = r.local.Get(ctx, dev, k); return err },
		func(base string) error {
			var out readingsResponse
			if err := r.c.call(ctx, base, pathGet, getRequest{Device: dev, Ticks: k}, &out); err != nil {
				return err
			}
			rs, err := fromWire(out.Readings)
			if err == nil && len(rs) != 1 {
				err = fmt.Errorf("%w: point answer with %d readings", errTransport, len(rs))
			}
			if err == nil {
				rd = rs[0]
			}
			return err
		})
	return rd, err
}

// Aggregate implements api.Aggregator.
func (r *Router) Aggregate(ctx context.Context, q buckets.AggregateQuery) (p buckets.AggregatePage, err error) {
	err = r.onOwner(ctx, q.Device,
		func() (err error) { p, err = r.local.Aggregate(ctx, q); return err },
		func(base string) error { p = buckets.AggregatePage{}; return r.c.call(ctx, base, pathAggregate, q, &p) })
	return p, err
}

// Device implements api.Attributes: the record of one device, from an
// owner of its partition.
func (r *Router) Device(ctx context.Context, dev buckets.DeviceID) (d buckets.DeviceInfo, err error) {
	err = r.onOwner(ctx, dev,
		func() (err error) { d, err = r.local.Device(ctx, dev); return err },
		func(base string) error {
			var out wireDevice
			if err := r.c.call(ctx, base, pathDevice, deviceRequest{Device: dev}, &out); err != nil {
				return err
			}
			d, err = fromWireDevice(&out)
			if err != nil {
				return fmt.Errorf("%w: %w", errTransport, err)
			}
			return nil
		})
	return d, err
}

// Assign implements api.Attributes. Every assignment goes to every
// node holding its device's partition (Membership.Holders, and any
// caught-up owner besides), whether or not that node has caught up on
// the partition's stream: each keeps the index of the partition's
// devices, and each may answer reads of the device later. A node
// skipped while it trails its stream would, once back, answer reads
// and later writes' answers without this write, and never get it.
// (A node that starts consuming the partition after the write, to take
// it over, does not have it: deploy/CLUSTER.md.)
//
// It succeeds when all of them applied it; a refusal (an invalid
// attribute) is returned as the node gave it. When a node cannot be
// reached the error names it and wraps buckets.ErrUnavailable:
// applying the same assignments again is harmless (the newest by At
// wins), so the client may retry.
func (r *Router) Assign(ctx context.Context, as []buckets.Assignment) error {
	byPart := map[int][]buckets.Assignment{}
	for _, a := range as {
		p := r.members.PartitionOf(a.Device)
		byPart[p] = append(byPart[p], a)
	}
	parts := make([]int, 0, len(byPart))
	for p := range byPart {
		parts = append(parts, p)
	}
	slices.Sort(parts)
	for _, p := range parts {
		if err := r.assignOn(ctx, p, byPart[p]); err != nil {
			return err
		}
	}
	return nil
}

// assignOn applies the assignments of partition p on every node
// holding it (Assign).
func (r *Router) assignOn(ctx context.Context, p int, as []buckets.Assignment) error {
	targets := assignTargets(r.members.Holders(p), r.members.Owners(p))
	if len(targets) == 0 {
		return unavailable(p, nil)
	}
	var errs []error
	for _, o := range targets {
		var err error
		if o.Self {
			err = r.local.Assign(ctx, as)
		} else {
			err = r.c.call(ctx, o.URL, pathAssign, assignRequest{Assignments: toWireAssignments(as)}, &struct{}{})
		}
		switch {
		case err == nil:
		case errors.Is(err, errTransport):
			r.log.WarnContext(ctx, "node did not take an attribute assignment", "partition", p, "node", o.Node, "err", err)
			errs = append(errs, fmt.Errorf("node %s: %w", o.Node, err))
		default:
			return err
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("partition %d: assignment not applied by every node holding it: %w: %w", p, errors.Join(errs...), buckets.ErrUnavailable)
	}
	return nil
}

// assignTargets is every node of holders and owners once, by node name,
// in the order given.
func assignTargets(holders, owners []Peer) []Peer {
	out := make([]Peer, 0, len(holders)+len(owners))
	for _, o := range slices.Concat(holders, owners) {
		if !slices.ContainsFunc(out, func(x Peer) bool { return x.Node == o.Node }) {
			out = append(out, o)
		}
	}
	return out
}

// perPartition runs ask once for every partition, on one of its owners,
// grouping the partitions each owner was chosen for (base "" is this
// node). A group whose owner did not answer (errTransport) is asked of
// the partitions' next owners; when the owner refused only some of the
// partitions (it does not serve them now: *notServingError), only
// those move on to their next owners and the rest are asked of it
// again. This node's own group holds only the partitions it serves
// now. Any other error ends the walk; a partition no owner answered
// for is an *UnavailableError naming it.
func (r *Router) perPartition(ctx context.Context, what string, ask func(base string, parts []int) error) error {
	n := r.members.Partitions()
	pending := make([]int, n)
	for p := range n {
		pending[p] = p
	}
	tried := map[int]int{}      // partition -> owners tried
	failed := map[int][]error{} // partition -> what its owners answered
	for len(pending) > 0 {
		groups := map[string][]int{} // owner URL ("" = self) -> partitions
		peers := map[string]Peer{}
		var next []int // partitions to ask of their next owner
		for _, p := range pending {
			owners := r.members.Owners(p)
			if tried[p] >= len(owners) {
				return unavailable(p, failed[p])
			}
			o := owners[tried[p]]
			key := o.URL
			if o.Self {
				key = ""
				if !r.servesHere(p) {
					tried[p]++
					failed[p] = append(failed[p], errNotServing(p))
					next = append(next, p)
					continue
				}
			}
			groups[key] = append(groups[key], p)
			peers[key] = o
		}
		pending = next
		keys := make([]string, 0, len(groups))
		for k := range groups {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, key := range keys {
			ps := groups[key]
			err := ask(key, ps)
			if errors.Is(err, errTransport) {
				refused := refusedOf(err, ps)
				r.log.WarnContext(ctx, "owner did not answer; trying the next", "what", what, "node", peers[key].Node,
					"partitions", refused, "err", err)
				for _, p := range refused {
					tried[p]++
					failed[p] = append(failed[p], err)
				}
				pending = append(pending, ps...)
				continue
			}
			if err != nil {
				return err
			}
			if key == "" {
				r.warnTrailing(ctx, ps...)
			}
		}
	}
	return nil
}

// refusedOf is the partitions of ps a failed call leaves to their next
// owners: those the owner said it does not serve, when it said so of
// some of ps, else all of ps.
func refusedOf(err error, ps []int) []int {
	var ns *notServingError
	if !errors.As(err, &ns) || len(ns.Partitions) == 0 {
		return ps
	}
	for _, p := range ns.Partitions {
		if !slices.Contains(ps, p) {
			return ps
		}
	}
	return ns.Partitions
}

// Devices implements api.Reader and promapi.Source: one owner per
// partition lists the devices of the partitions it was chosen for; the
// sorted lists are merged. dq.Visible must be the caller's own device
// patterns (auth.FromContext): a remote owner applies those itself,
// from the rights of the client the call serves.
func (r *Router) Devices(ctx context.Context, dq buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	if dq.Limit < 1 {
		return nil, false, fmt.Errorf("limit %d: %w", dq.Limit, buckets.ErrInvalidArgument)
	}
	var all []buckets.DeviceInfo
	more := false
	err := r.perPartition(ctx, "devices", func(base string, ps []int) error {
		q := devicesRequest{Prefix: dq.Prefix, After: dq.After, Limit: dq.Limit, Partitions: ps,
			Match: matchersToWire(dq.Match), SilentBefore: dq.SilentBefore}
		devs, m, err := r.devicesOn(ctx, base, q, dq)
		if err != nil {
			return err
		}
		all = append(all, devs...)
		more = more || m
		return nil
	})
	if err != nil {
		return nil, false, err
	}
	slices.SortFunc(all, func(a, b buckets.DeviceInfo) int { return cmp.Compare(a.Device, b.Device) })
	all = slices.CompactFunc(all, func(a, b buckets.DeviceInfo) bool { return a.Device == b.Device })
	if len(all) > dq.Limit {
		all, more = all[:dq.Limit], true
	}
	return all, more, nil
}

// devicesOn asks one node (base "" = this one) for the devices of some
// partitions.
func (r *Router) devicesOn(ctx context.Context, base string, q devicesRequest, dq buckets.DeviceQuery) ([]buckets.DeviceInfo, bool, error) {
	if base == "" {
		visible := func(d buckets.DeviceID) bool {
			return slices.Contains(q.Partitions, r.members.PartitionOf(d)) && (dq.Visible == nil || dq.Visible(d))
		}
		return r.local.Devices(ctx, buckets.DeviceQuery{Prefix: dq.Prefix, After: dq.After, Limit: dq.Limit,
			Match: dq.Match, SilentBefore: dq.SilentBefore, Visible: visible})
	}
	var out devicesResponse
	if err := r.c.call(ctx, base, pathDevices, q, &out); err != nil {
		return nil, false, err
	}
	devs := make([]buckets.DeviceInfo, len(out.Devices))
	for i := range out.Devices {
		d, err := fromWireDevice(&out.Devices[i])
		if err != nil {
			return nil, false, fmt.Errorf("%w: %w", errTransport, err)
		}
		devs[i] = d
	}
	return devs, out.More, nil
}

// AttributeNames implements promapi.AttributeIndex: the names known to
// one owner per partition, merged.
func (r *Router) AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error) {
	return r.attributes(ctx, "", q)
}

// AttributeValues implements promapi.AttributeIndex: the values of name
// known to one owner per partition, merged.
func (r *Router) AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error) {
	return r.attributes(ctx, name, q)
}

// attributes answers AttributeNames (name "") and AttributeValues.
func (r *Router) attributes(ctx context.Context, name string, dq buckets.DeviceQuery) ([]string, error) {
	var all []string
	err := r.perPartition(ctx, "attributes", func(base string, ps []int) error {
		var vals []string
		var err error
		if base == "" {
			q := dq
			q.Visible = func(d buckets.DeviceID) bool {
				return slices.Contains(ps, r.members.PartitionOf(d)) && (dq.Visible == nil || dq.Visible(d))
			}
			if name == "" {
				vals, err = r.local.AttributeNames(ctx, q)
			} else {
				vals, err = r.local.AttributeValues(ctx, name, q)
			}
		} else {
			var out attributesResponse
			err = r.c.call(ctx, base, pathAttrs, attributesRequest{Name: name, Prefix: dq.Prefix,
				Match: matchersToWire(dq.Match), Partitions: ps}, &out)
			vals = out.Values
		}
		if err != nil {
			return err
		}
		all = append(all, vals...)
		return nil
	})
	if err != nil {
		return nil, err
	}
	slices.Sort(all)
	return slices.Compact(all), nil
}

// Tables implements api.Reader: the day tables of every live node,
// merged by day. SizeBytes is the disk the day takes across the
// cluster, copies included; Readings is -1 (unknown), since the nodes'
// tables overlap by partition and no node counts per partition.
func (r *Router) Tables(ctx context.Context) ([]buckets.TableInfo, error) {
	byDay := map[buckets.Day]*buckets.TableInfo{}
	err := r.everyNode(ctx, func(p Peer) error {
		var ts []buckets.TableInfo
		if p.Self {
			var err error
			if ts, err = r.local.Tables(ctx); err != nil {
				return err
			}
		} else {
			var out tablesResponse
			if err := r.c.call(ctx, p.URL, pathTables, nil, &out); err != nil {
				return err
			}
			ts = out.Tables
		}
		for _, t := range ts {
			if m, ok := byDay[t.Day]; ok {
				m.SizeBytes += t.SizeBytes
				continue
			}
			byDay[t.Day] = &buckets.TableInfo{Day: t.Day, SizeBytes: t.SizeBytes, Readings: -1}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	out := make([]buckets.TableInfo, 0, len(byDay))
	for _, t := range byDay {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(a, b buckets.TableInfo) int { return cmp.Compare(a.Day, b.Day) })
	return out, nil
}

// DropTable drops the day on every live node. It reports the bytes
// freed across the cluster; the error wraps buckets.ErrNotFound when no
// node had the day, and names the nodes that failed (the drop is done
// on the others; repeating it is safe).
func (r *Router) DropTable(ctx context.Context, day buckets.Day) (buckets.TableDrop, error) {
	total := buckets.TableDrop{Day: day, Readings: -1}
	found := false
	err := r.everyNode(ctx, func(p Peer) error {
		var d buckets.TableDrop
		var err error
		if p.Self {
			d, err = r.local.DropTable(ctx, day)
		} else {
			err = r.c.call(ctx, p.URL, pathDrop, dropRequest{Day: day}, &d)
		}
		if errors.Is(err, buckets.ErrNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		found = true
		total.SizeBytes += d.SizeBytes
		return nil
	})
	if err != nil {
		return total, err
	}
	if !found {
		return total, fmt.Errorf("table %s on no node: %w", day, buckets.ErrNotFound)
	}
	return total, nil
}

// everyNode runs f for every live node, one after the other; it
// returns the failures, each naming its node.
func (r *Router) everyNode(ctx context.Context, f func(Peer) error) error {
	var errs []error
	var names []string
	for _, p := range r.members.Nodes() {
		if err := f(p); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			errs = append(errs, fmt.Errorf("node %s: %w", p.Node, err))
			names = append(names, p.Node)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("nodes %s did not answer: %w: %w", strings.Join(names, ", "), errors.Join(errs...), buckets.ErrUnavailable)
	}
	return nil
}
