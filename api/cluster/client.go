package cluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/buckets"
)

// maxResponseBytes bounds an internal answer read into memory: a full
// range page (10,000 readings) of wide readings fits many times over.
const maxResponseBytes = 256 << 20

// errTransport marks a failure to reach a node or a node's 5xx: the
// caller tries another owner.
var errTransport = errors.New("node unreachable")

// codeNotServing is a node's refusal to answer for partitions it does
// not serve now (503): the caller asks their next owners.
const codeNotServing = "not_serving"

// notServingError is a node's refusal (codeNotServing) of some
// partitions; it wraps errTransport, so the caller moves on.
type notServingError struct {
	Partitions []int
	msg        string
}

func (e *notServingError) Error() string { return e.msg }
func (e *notServingError) Unwrap() error { return errTransport }

// client calls other nodes' internal API.
type client struct {
	http       *http.Client
	credential string // the cluster credential
}

// call POSTs (or GETs, when in is nil) to url+path and decodes the
// answer into out. The call carries the cluster credential and names
// the client of ctx (auth.FromContext) it serves. A 404 wraps
// buckets.ErrNotFound, a 400 buckets.ErrInvalidArgument (or the
// *buckets.ValidationError of a refused assignment); anything else
// failing (a 401 or 403 of a node with another credential or auth file
// included) wraps errTransport; a node's refusal of partitions it does
// not serve is a *notServingError naming them. The warnings of a
// successful answer (HeaderWarning) are added to ctx's
// (buckets.Warn).
func (c *client) call(ctx context.Context, base, path string, in, out any) error {
	method, body := http.MethodGet, io.Reader(nil)
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode %s request: %w", path, err)
		}
		method, body = http.MethodPost, bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, strings.TrimSuffix(base, "/")+path, body)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+c.credential)
	if isNodeCall(ctx) {
		req.Header.Set(HeaderCaller, callerNode)
	} else {
		req.Header.Set(HeaderCaller, callerOf(auth.FromContext(ctx)))
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%w: %w", errTransport, err)
	}
	defer resp.Body.Close()
	lr := &io.LimitedReader{R: resp.Body, N: maxResponseBytes + 1}
	if resp.StatusCode != http.StatusOK {
		var e errorResponse
		_ = json.NewDecoder(io.LimitReader(lr, 64<<10)).Decode(&e)
		msg := fmt.Sprintf("%s%s: %d %s", base, path, resp.StatusCode, e.Message)
		switch resp.StatusCode {
		case http.StatusNotFound:
			if e.Code == "" { // the node has no internal API at all
				return fmt.Errorf("%w: %s", errTransport, msg)
			}
			return fmt.Errorf("%s: %w", msg, buckets.ErrNotFound)
		case http.StatusBadRequest:
			if e.Code != "" && e.Code != "invalid_argument" { // a rejection with its code
				return buckets.Invalid(buckets.Code(e.Code), -1, e.Field, "%s", e.Message)
			}
			return fmt.Errorf("%s: %w", e.Message, buckets.ErrInvalidArgument)
		case http.StatusServiceUnavailable:
			if e.Code == codeNotServing {
				return &notServingError{Partitions: e.Partitions, msg: msg}
			}
		}
		return fmt.Errorf("%w: %s", errTransport, msg)
	}
	if err := json.NewDecoder(lr).Decode(out); err != nil {
		return fmt.Errorf("%w: decode %s%s: %w", errTransport, base, path, err)
	}
	if lr.N <= 0 {
		return fmt.Errorf("%w: %s%s: answer larger than %d bytes", errTransport, base, path, maxResponseBytes)
	}
	forwardWarnings(ctx, resp)
	return nil
}
