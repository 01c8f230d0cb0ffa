package ingest

import (
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/telemetryd/telemetryd/buckets"
)

// attributes decodes the value of a reading's "attributes" member: an
// object of string values, appended to d.attrs under a new attrSpan.
// endAttributes finishes the span once the reading's time is known.
func (d *decoder) attributes() *buckets.ValidationError {
	if d.pos >= len(d.buf) || !isValueStart(d.buf[d.pos]) {
		return d.syntax("a value")
	}
	if c := d.buf[d.pos]; c != '{' {
		return d.fail(buckets.CodeInvalidAttributeValue, "attributes",
			"must be an object of string values, got %s", jsonKind(c))
	}
	d.pos++
	start := len(d.attrs)
	d.aspans = append(d.aspans, attrSpan{start: start, end: start})
	return d.members(func(key []byte) *buckets.ValidationError {
		name := d.intern(key)
		if len(d.attrs)-start == buckets.MaxAttributes {
			return d.fail(buckets.CodeTooManyAttributes, "attributes",
				"more than %d attributes (at %s)", buckets.MaxAttributes, attrField(name))
		}
		if _, ok := d.attrNames[name]; !ok {
			if ve := buckets.ValidateAttributeName(name); ve != nil {
				ve.Index, ve.Field = d.index, attrField(name)
				return ve
			}
			if len(d.attrNames) >= maxInterned {
				clear(d.attrNames)
			}
			d.attrNames[name] = struct{}{}
		}
		if d.pos >= len(d.buf) || !isValueStart(d.buf[d.pos]) {
			return d.syntax("a value")
		}
		if c := d.buf[d.pos]; c != '"' {
			return d.fail(buckets.CodeInvalidAttributeValue, attrField(name), "an attribute value must be a string, got %s", jsonKind(c))
		}
		b, err := d.str()
		if err != nil {
			return err
		}
		if len(b) == 0 || len(b) > buckets.MaxAttributeValueBytes || !utf8.Valid(b) {
			if ve := buckets.ValidateAttributeValue(name, string(b)); ve != nil {
				ve.Index, ve.Field = d.index, attrField(name)
				return ve
			}
		}
		value := string(b)
		d.attrs = append(d.attrs, buckets.Attribute{Name: name, Value: value})
		d.aspans[len(d.aspans)-1].end = len(d.attrs)
		return nil
	})
}

// endAttributes sorts the attributes of the reading just decoded,
// rejects a name given twice and records the reading's time; an empty
// object assigns nothing.
func (d *decoder) endAttributes(ticks buckets.Ticks) *buckets.ValidationError {
	s := &d.aspans[len(d.aspans)-1]
	if s.start == s.end {
		d.aspans = d.aspans[:len(d.aspans)-1]
		return nil
	}
	s.ticks = ticks
	as := d.attrs[s.start:s.end]
	slices.SortFunc(as, func(x, y buckets.Attribute) int { return strings.Compare(x.Name, y.Name) })
	for i := 1; i < len(as); i++ {
		if as[i].Name == as[i-1].Name {
			return d.fail(buckets.CodeInvalidAttributeName, attrField(as[i].Name), "attribute name appears more than once")
		}
	}
	return nil
}

// assignments builds the assignments of the message, one per reading
// object with attributes, sharing one copy of d.attrs. Together they
// may name at most buckets.MaxAttributes attributes.
func (d *decoder) assignments() ([]buckets.Assignment, *buckets.ValidationError) {
	if len(d.attrs) > buckets.MaxAttributes {
		names := make(map[string]struct{}, buckets.MaxAttributes+1)
		for _, a := range d.attrs {
			names[a.Name] = struct{}{}
		}
		if len(names) > buckets.MaxAttributes {
			return nil, buckets.Invalid(buckets.CodeTooManyAttributes, -1, "attributes",
				"the message's readings name %d attributes, at most %d are allowed", len(names), buckets.MaxAttributes)
		}
	}
	all := slices.Clone(d.attrs)
	as := make([]buckets.Assignment, len(d.aspans))
	for i, s := range d.aspans {
		as[i] = buckets.Assignment{Device: d.device, At: s.ticks, Set: all[s.start:s.end:s.end]}
	}
	return as, nil
}

// attrField is the error field of the attribute named name.
func attrField(name string) string {
	if name == "" {
		return "attributes"
	}
	return "attributes." + shortName(name)
}

// jsonKind names the kind of JSON value that starts with c.
func jsonKind(c byte) string {
	switch c {
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		return "a string"
	}
	return "a number"
}
