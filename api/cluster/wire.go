package cluster

import (
	"fmt"
	"strings"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// The node-to-node API speaks JSON. Values travel in the store's own
// value codec (buckets.AppendValues, base64 in JSON), so every kind and
// every float bit pattern arrives exactly as stored.

// wireReading is a buckets.Reading on the wire.
type wireReading struct {
	Device buckets.DeviceID `json:"d"`
	Ticks  buckets.Ticks    `json:"k"`
	Values []byte           `json:"v"`
}

func toWire(rs []buckets.Reading) []wireReading {
	out := make([]wireReading, len(rs))
	for i, r := range rs {
		out[i] = wireReading{Device: r.Device, Ticks: r.Ticks, Values: buckets.AppendValues(nil, r.Values)}
	}
	return out
}

func fromWire(ws []wireReading) ([]buckets.Reading, error) {
	out := make([]buckets.Reading, len(ws))
	for i, w := range ws {
		vs, err := buckets.DecodeValues(w.Values)
		if err != nil {
			return nil, fmt.Errorf("reading %d of %s: %w", i, w.Device, err)
		}
		out[i] = buckets.Reading{Device: w.Device, Ticks: w.Ticks, Values: vs}
	}
	return out, nil
}

// wireDevice is a buckets.DeviceInfo on the wire. A device the caller
// may not see comes as a bare position (Hidden, no data): the asking
// node pages on, and never shows it.
type wireDevice struct {
	Device    buckets.DeviceID `json:"d"`
	FirstSeen buckets.Ticks    `json:"f"`
	LastSeen  buckets.Ticks    `json:"l"`
	Latest    []byte           `json:"v"`
	Hidden    bool             `json:"h,omitempty"`
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
// partitions the asking node chose this one for).
type devicesRequest struct {
	Prefix     string           `json:"prefix"`
	After      buckets.DeviceID `json:"after"`
	Limit      int              `json:"limit"`
	Partitions []int            `json:"partitions"`
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

// errorResponse is the body of a failed internal call.
type errorResponse struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}
