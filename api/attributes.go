package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// MaxAttributesBodyBytes bounds the body of an attribute write: the
// largest valid set (64 attributes of 64-byte names and 256-byte values,
// every byte of each value written as a \u escape) fits.
const MaxAttributesBodyBytes = 128 << 10

// handleDevice serves GET /v1/devices/{device}: the device's record
// with its attributes. A device outside the token's patterns is a 404
// like an unknown one (authenticate).
func (s *Server) handleDevice(c echo.Context) error {
	dev, err := deviceParam(c)
	if err != nil {
		return err
	}
	if s.attributes == nil {
		return notImplemented("device records are not served by this instance")
	}
	d, err := s.attributes.Device(c.Request().Context(), dev)
	if errors.Is(err, buckets.ErrNotFound) {
		return notFound("device", "%q is not known", dev)
	}
	if err != nil {
		return readerError(err, "device %s", dev)
	}
	return sendValue(c, http.StatusOK, deviceOf(&d))
}

// handlePutAttributes serves PUT /v1/devices/{device}/attributes: the
// body, a JSON object of strings, becomes the device's whole attribute
// set.
func (s *Server) handlePutAttributes(c echo.Context) error { return s.assign(c, true) }

// handlePatchAttributes serves PATCH /v1/devices/{device}/attributes:
// the body's attributes are set, those given null removed, the others
// kept.
func (s *Server) handlePatchAttributes(c echo.Context) error { return s.assign(c, false) }

// assign applies the body as of the request's arrival and answers the
// device's attributes after it.
func (s *Server) assign(c echo.Context, replace bool) error {
	at, err := buckets.TicksOf(s.now()) // the arrival: the newest assignment by time wins
	if err != nil {
		return err
	}
	dev, err := deviceParam(c)
	if err != nil {
		return err
	}
	if s.attributes == nil {
		return notImplemented("attribute writes are not served by this instance")
	}
	a, err := readAssignment(c.Request(), replace)
	if err != nil {
		return err
	}
	a.Device, a.At = dev, at
	ctx := c.Request().Context()
	if err := s.attributes.Assign(ctx, []buckets.Assignment{a}); err != nil {
		return readerError(err, "assign attributes of %s", dev)
	}
	d, err := s.attributes.Device(ctx, dev)
	if err != nil {
		return readerError(err, "device %s after assigning its attributes", dev)
	}
	return sendValue(c, http.StatusOK, AttributeSet{Device: string(dev), Attributes: d.Attributes.Map()})
}

// readAssignment reads the body of an attribute write: a JSON object
// whose values are strings, or (PATCH only) null to remove the
// attribute. Attributes are checked in name order, so a body with two
// bad ones always names the same one.
func readAssignment(r *http.Request, replace bool) (buckets.Assignment, error) {
	if r.ContentLength > MaxAttributesBodyBytes {
		return buckets.Assignment{}, attributesTooLarge()
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxAttributesBodyBytes+1))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return buckets.Assignment{}, tooLarge()
	case err != nil:
		return buckets.Assignment{}, err
	case len(body) > MaxAttributesBodyBytes:
		return buckets.Assignment{}, attributesTooLarge()
	case len(bytes.TrimSpace(body)) == 0:
		return buckets.Assignment{}, invalidArg("body", `missing; give a JSON object of attribute names and string values, e.g. {"fleet":"East"}`)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(body, &raw); err != nil {
		return buckets.Assignment{}, invalidArg("body", `not a JSON object of attribute names and string values: %v`, err)
	}
	names := make([]string, 0, len(raw))
	for n := range raw {
		names = append(names, n)
	}
	slices.Sort(names)
	a := buckets.Assignment{Replace: replace}
	for _, n := range names {
		if ve := buckets.ValidateAttributeName(n); ve != nil {
			return buckets.Assignment{}, ve
		}
		v := raw[n]
		if string(v) == "null" {
			if replace {
				return buckets.Assignment{}, attributeValueError(n, "null removes an attribute only in a PATCH; a PUT gives the whole set")
			}
			a.Remove = append(a.Remove, n)
			continue
		}
		var sv string
		if err := json.Unmarshal(v, &sv); err != nil {
			return buckets.Assignment{}, attributeValueError(n, "must be a string (or null in a PATCH to remove it)")
		}
		if ve := buckets.ValidateAttributeValue(n, sv); ve != nil {
			return buckets.Assignment{}, ve
		}
		a.Set = append(a.Set, buckets.Attribute{Name: n, Value: sv})
	}
	if len(a.Set) > buckets.MaxAttributes {
		return buckets.Assignment{}, buckets.Invalid(buckets.CodeTooManyAttributes, -1, "attributes",
			"%d attributes, at most %d are allowed", len(a.Set), buckets.MaxAttributes)
	}
	return a, nil
}

func attributesTooLarge() *apiError {
	return &apiError{http.StatusRequestEntityTooLarge, codePayloadTooLarge,
		"body: an attribute write is at most " + strconv.Itoa(MaxAttributesBodyBytes) + " bytes"}
}

func attributeValueError(name, msg string) *buckets.ValidationError {
	return buckets.Invalid(buckets.CodeInvalidAttributeValue, -1, "attributes."+name, "%s", msg)
}

// notImplemented is a 501 for an optional part this server was built
// without.
func notImplemented(msg string) *apiError {
	return &apiError{http.StatusNotImplemented, codeNotImplemented, "path: " + msg}
}
