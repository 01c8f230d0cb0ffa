package cluster

import (
	"fmt"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/api/cluster/nodewire"
	"github.com/telemetryd/telemetryd/buckets"
)

// The node-to-node API speaks JSON under /internal/v1/. Values travel
// in the versioned encoding of package nodewire (base64 in JSON), which
// belongs to this API and not to the store, so every kind and every
// float bit pattern arrives exactly as stored whatever the store keeps
// on disk.

// wireReading is a buckets.Reading on the wire.
type wireReading struct {
	Device buckets.DeviceID `json:"d"`
	Ticks  buckets.Ticks    `json:"k"`
	Values []byte           `json:"v"`
}

func toWire(rs []buckets.Reading) []wireReading {
	out := make([]wireReading, len(rs))
	for i, r := range rs {
		out[i] = wireReading{Device: r.Device, Ticks: r.Ticks, Values: nodewire.AppendValues(nil, r.Values)}
	}
	return out
}

func fromWire(ws []wireReading) ([]buckets.Reading, error) {
	out := make([]buckets.Reading, len(ws))
	for i, w := range ws {
		vs, err := nodewire.DecodeValues(w.Values)
		if err != nil {
			return nil, fmt.Errorf("reading %d of %s: %w", i, w.Device, err)
		}
		out[i] = buckets.Reading{Device: w.Device, Ticks: w.Ticks, Values: vs}
	}
	return out, nil
}

// wireDevice is a buckets.DeviceInfo on the wire. Nodes answer only
// devices their caller may see.
type wireDevice struct {
	Device     buckets.DeviceID  `json:"d"`
	FirstSeen  buckets.Ticks     `json:"f"`
	LastSeen   buckets.Ticks     `json:"l"`
	Latest     []byte            `json:"v"`
	Attributes map[string]string `json:"a,omitempty"`
}

func toWireDevice(d *buckets.DeviceInfo) wireDevice {
	w := wireDevice{Device: d.Device, FirstSeen: d.FirstSeen, LastSeen: d.LastSeen, Latest: nodewire.AppendValues(nil, d.Latest)}
	if len(d.Attributes) > 0 {
		w.Attributes = d.Attributes.Map()
	}
	return w
}

func fromWireDevice(w *wireDevice) (buckets.DeviceInfo, error) {
	latest, err := nodewire.DecodeValues(w.Latest)
	if err != nil {
		return buckets.DeviceInfo{}, fmt.Errorf("device %s: %w", w.Device, err)
	}
	var attrs buckets.Attributes
	if len(w.Attributes) > 0 {
		var verr *buckets.ValidationError
		if attrs, verr = buckets.NewAttributes(w.Attributes); verr != nil {
			return buckets.DeviceInfo{}, fmt.Errorf("device %s: %w", w.Device, verr)
		}
	}
	return buckets.DeviceInfo{Device: w.Device, FirstSeen: w.FirstSeen, LastSeen: w.LastSeen, Latest: latest, Attributes: attrs}, nil
}

// Matchers travel as their PromQL text (fleet=~"F-.*"), parsed again by
// the answering node.
func matchersToWire(ms []*buckets.Matcher) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.String()
	}
	return out
}

func matchersFromWire(ss []string) ([]*buckets.Matcher, error) {
	if len(ss) == 0 {
		return nil, nil
	}
	ms, err := parser.NewParser(parser.Options{}).ParseMetricSelector("{" + strings.Join(ss, ",") + "}")
	if err != nil {
		return nil, fmt.Errorf("matchers %q: %w: %w", ss, err, buckets.ErrInvalidArgument)
	}
	out := make([]*buckets.Matcher, len(ms))
	for i, m := range ms {
		if out[i], err = buckets.NewMatcher(buckets.MatchType(m.Type), m.Name, m.Value); err != nil {
			return nil, fmt.Errorf("matchers %q: %w", ss, err)
		}
	}
	return out, nil
}

// HeaderCaller names, on every node-to-node call, the client whose
// request the call serves: "token <name>" for a request made with that
// API token, "open" when the calling node has no authentication. The
// answering node applies that token's scopes and device patterns as its
// own auth file has them. It is believed only on a call that carries
// the cluster credential, which no client has, so a client cannot
// claim another's rights.
const HeaderCaller = "Telemetry-Caller"

const (
	callerOpen  = "open"
	callerNode  = "node" // the calling node's own call, serving no client (pathAttrState)
	callerToken = "token "
)

// callerOf is the HeaderCaller value of a request's principal.
func callerOf(p *auth.Principal) string {
	if p == nil {
		return callerOpen
	}
	return callerToken + p.Name
}

// parseCaller returns the token name of a HeaderCaller value ("" and
// open for "open").
func parseCaller(v string) (name string, open bool, err error) {
	switch {
	case v == callerOpen:
		return "", true, nil
	case v == callerNode:
		return "", false, nil
	case strings.HasPrefix(v, callerToken) && len(v) > len(callerToken):
		return v[len(callerToken):], false, nil
	case v == "":
		return "", false, fmt.Errorf("header %s is missing: a node-to-node call names the client it serves", HeaderCaller)
	}
	return "", false, fmt.Errorf("header %s %q: want %q or %q", HeaderCaller, v, callerOpen, callerToken+"<name>")
}

type latestRequest struct {
	Device buckets.DeviceID `json:"device"`
	N      int              `json:"n"`
}

type readingsResponse struct {
	Readings []wireReading `json:"readings"`
	More     bool          `json:"more,omitempty"`
}

type getRequest struct {
	Device buckets.DeviceID `json:"device"`
	Ticks  buckets.Ticks    `json:"ticks"`
}

// devicesRequest lists the devices of some partitions only (the
// partitions the asking node chose this one for). The answering node
// applies its caller's device patterns itself.
type devicesRequest struct {
	Prefix       string           `json:"prefix"`
	After        buckets.DeviceID `json:"after"`
	Limit        int              `json:"limit"`
	Partitions   []int            `json:"partitions"`
	Match        []string         `json:"match,omitempty"`
	SilentBefore buckets.Ticks    `json:"silentBefore,omitempty"`
}

type deviceRequest struct {
	Device buckets.DeviceID `json:"device"`
}

// attributesRequest asks for the attribute names (Name empty) or the
// values of the attribute Name among the devices of some partitions.
type attributesRequest struct {
	Name       string   `json:"name,omitempty"`
	Prefix     string   `json:"prefix"`
	Match      []string `json:"match,omitempty"`
	Partitions []int    `json:"partitions"`
}

type attributesResponse struct {
	Values []string `json:"values"`
}

// wireAssignment is a buckets.Assignment on the wire.
type wireAssignment struct {
	Device  buckets.DeviceID  `json:"device"`
	At      buckets.Ticks     `json:"at"`
	Set     map[string]string `json:"set,omitempty"`
	Remove  []string          `json:"remove,omitempty"`
	Replace bool              `json:"replace,omitempty"`
}

func toWireAssignments(as []buckets.Assignment) []wireAssignment {
	out := make([]wireAssignment, len(as))
	for i, a := range as {
		out[i] = wireAssignment{Device: a.Device, At: a.At, Remove: a.Remove, Replace: a.Replace}
		if len(a.Set) > 0 {
			out[i].Set = a.Set.Map()
		}
	}
	return out
}

// fromWireAssignments checks the attributes set as the store would; the
// error is the *buckets.ValidationError of the first bad one.
func fromWireAssignments(ws []wireAssignment) ([]buckets.Assignment, error) {
	out := make([]buckets.Assignment, len(ws))
	for i, w := range ws {
		set, verr := buckets.NewAttributes(w.Set)
		if verr != nil {
			return nil, verr
		}
		out[i] = buckets.Assignment{Device: w.Device, At: w.At, Set: set, Remove: w.Remove, Replace: w.Replace}
	}
	return out, nil
}

type assignRequest struct {
	Assignments []wireAssignment `json:"assignments"`
}

type devicesResponse struct {
	Devices []wireDevice `json:"devices"`
	More    bool         `json:"more,omitempty"`
}

type tablesResponse struct {
	Tables []buckets.TableInfo `json:"tables"`
}

type dropRequest struct {
	Day buckets.Day `json:"day"`
}

// errorResponse is the body of a failed internal call. A refused
// assignment carries its rejection code and the field at fault, so the
// asking node answers its client as this one would have.
type errorResponse struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// Partitions are those a refusal with code not_serving is about.
	Partitions []int `json:"partitions,omitempty"`
}
