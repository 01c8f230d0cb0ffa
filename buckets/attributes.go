package buckets

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// Attribute limits. A device has at most MaxAttributes attributes; a
// value is 1 to MaxAttributeValueBytes bytes of UTF-8.
const (
	MaxAttributes          = 64
	MaxAttributeNameBytes  = 64
	MaxAttributeValueBytes = 256
)

// Attribute rejection codes.
const (
	CodeInvalidAttributeName  Code = "invalid_attribute_name"
	CodeInvalidAttributeValue Code = "invalid_attribute_value"
	CodeTooManyAttributes     Code = "too_many_attributes"
)

// Attribute is one named property of a device, such as fleet="East".
// Every valid name is also a valid Prometheus label name, so attributes
// become the labels of the device's series.
type Attribute struct {
	Name  string
	Value string
}

// Attributes is a device's attribute set, sorted by name, names unique.
type Attributes []Attribute

// Get returns the value of the attribute named name.
func (a Attributes) Get(name string) (string, bool) {
	i, ok := slices.BinarySearchFunc(a, name, func(x Attribute, n string) int { return strings.Compare(x.Name, n) })
	if !ok {
		return "", false
	}
	return a[i].Value, true
}

// Map returns the set as a map, for encoding as a JSON object.
func (a Attributes) Map() map[string]string {
	m := make(map[string]string, len(a))
	for _, x := range a {
		m[x.Name] = x.Value
	}
	return m
}

// ValidateAttributeName checks name: `^[A-Za-z_][A-Za-z0-9_]{0,63}$`,
// not "device" (the label that names the device) and not starting with
// "__" (reserved by Prometheus).
func ValidateAttributeName(name string) *ValidationError {
	field := "attributes." + name
	switch {
	case name == "":
		return invalid(CodeInvalidAttributeName, "attributes", "attribute name is empty")
	case len(name) > MaxAttributeNameBytes:
		return invalid(CodeInvalidAttributeName, field, "attribute name is %d bytes, at most %d are allowed", len(name), MaxAttributeNameBytes)
	case name == "device":
		return invalid(CodeInvalidAttributeName, field, `"device" names the device and cannot be an attribute`)
	case strings.HasPrefix(name, "__"):
		return invalid(CodeInvalidAttributeName, field, `attribute names starting with "__" are reserved`)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		letter := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || c < '0' || c > '9') {
			return invalid(CodeInvalidAttributeName, field, "attribute name must match [A-Za-z_][A-Za-z0-9_]*")
		}
	}
	return nil
}

// ValidateAttributeValue checks the value of the attribute named name:
// 1 to MaxAttributeValueBytes bytes of valid UTF-8.
func ValidateAttributeValue(name, value string) *ValidationError {
	field := "attributes." + name
	switch {
	case value == "":
		return invalid(CodeInvalidAttributeValue, field, "attribute value is empty")
	case len(value) > MaxAttributeValueBytes:
		return invalid(CodeInvalidAttributeValue, field, "attribute value is %d bytes, at most %d are allowed", len(value), MaxAttributeValueBytes)
	case !utf8.ValidString(value):
		return invalid(CodeInvalidAttributeValue, field, "attribute value is not valid UTF-8")
	}
	return nil
}

// NewAttributes validates m and returns it as a sorted set.
func NewAttributes(m map[string]string) (Attributes, *ValidationError) {
	if len(m) > MaxAttributes {
		return nil, invalid(CodeTooManyAttributes, "attributes", "%d attributes, at most %d are allowed", len(m), MaxAttributes)
	}
	a := make(Attributes, 0, len(m))
	for name, value := range m {
		if err := ValidateAttributeName(name); err != nil {
			return nil, err
		}
		if err := ValidateAttributeValue(name, value); err != nil {
			return nil, err
		}
		a = append(a, Attribute{name, value})
	}
	slices.SortFunc(a, func(x, y Attribute) int { return strings.Compare(x.Name, y.Name) })
	return a, nil
}

// Assignment changes the attributes of one device as of At: the time
// of the reading that carried it, or the arrival of the HTTP request.
// For every attribute the newest assignment by At wins, whatever the
// order they arrive in, so redelivered and late messages never roll an
// attribute back.
type Assignment struct {
	Device DeviceID
	At     Ticks
	// Set holds the attributes given values.
	Set Attributes
	// Remove names the attributes removed (a PATCH with null).
	Remove []string
	// Replace removes every attribute not in Set (a PUT).
	Replace bool
}

// DeviceQuery selects devices of the index.
type DeviceQuery struct {
	// Prefix keeps devices whose ID starts with it.
	Prefix string
	// After resumes the listing behind this device (empty: from the
	// start). Devices are listed in ascending ID order.
	After DeviceID
	// Limit is the most devices returned; it must be positive.
	Limit int
	// Match keeps devices whose attributes satisfy every matcher, with
	// PromQL's rules: an attribute the device lacks matches as the empty
	// string; the name "device" matches the device ID.
	Match []*Matcher
	// SilentBefore, when not zero, keeps devices whose last reading is
	// older than it.
	SilentBefore Ticks
	// Visible, when set, keeps only the devices it accepts (the caller's
	// device patterns). Attribute names and values are learned only from
	// visible devices.
	Visible func(DeviceID) bool
}
