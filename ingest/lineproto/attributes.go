package lineproto

import (
	"cmp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/telemetryd/telemetryd/buckets"
)

// tagAttributes validates the other tags of the current line (m.tags)
// as attributes and leaves them in m.attrs, sorted by name.
func (m *mapper) tagAttributes() *buckets.ValidationError {
	m.attrs = m.attrs[:0]
	if len(m.tags) > buckets.MaxAttributes {
		return invalid(buckets.CodeTooManyAttributes, "tags", "%d tags besides the device tag, at most %d attributes are allowed",
			len(m.tags), buckets.MaxAttributes)
	}
	sorted := true
	for _, t := range m.tags {
		name, ve := m.attrName(t.key)
		if ve != nil {
			return ve
		}
		if !attrValueOK(t.value) {
			if ve := buckets.ValidateAttributeValue(name, t.value); ve != nil {
				ve.Field = "tag " + name
				return ve
			}
		}
		if n := len(m.attrs); n > 0 && m.attrs[n-1].Name >= name {
			sorted = false
		}
		m.attrs = append(m.attrs, lineAttr{Attribute: buckets.Attribute{Name: name, Value: t.value}, line: int32(m.cur)})
	}
	if !sorted {
		return m.sortAttrs()
	}
	return nil
}

// sortAttrs sorts m.attrs by name, or names one given twice. Lines of a
// request mostly give the same tags in the same order: their order is
// then the one found for an earlier line (m.attrPerm).
func (m *mapper) sortAttrs() *buckets.ValidationError {
	same := len(m.attrPermNames) == len(m.attrs)
	for i := 0; same && i < len(m.attrs); i++ {
		same = m.attrPermNames[i] == m.attrs[i].Name
	}
	if !same {
		m.attrPermNames, m.attrPerm = m.attrPermNames[:0], m.attrPerm[:0]
		for i, a := range m.attrs {
			m.attrPermNames = append(m.attrPermNames, a.Name)
			m.attrPerm = append(m.attrPerm, i)
		}
		slices.SortFunc(m.attrPerm, func(x, y int) int { return strings.Compare(m.attrs[x].Name, m.attrs[y].Name) })
		for i := 1; i < len(m.attrPerm); i++ {
			if name := m.attrs[m.attrPerm[i]].Name; name == m.attrs[m.attrPerm[i-1]].Name {
				m.attrPermNames = m.attrPermNames[:0]
				return invalid(buckets.CodeInvalidAttributeName, "tag "+name, "the line gives this tag twice")
			}
		}
	}
	m.attrTmp = append(m.attrTmp[:0], m.attrs...)
	for i, j := range m.attrPerm {
		m.attrs[i] = m.attrTmp[j]
	}
	return nil
}

// attrName returns the tag key as an interned attribute name, or why it
// is not a valid one.
func (m *mapper) attrName(key []byte) (string, *buckets.ValidationError) {
	if n, ok := m.attrOK[string(key)]; ok {
		return n, nil
	}
	if ve, ok := m.badAttr[string(key)]; ok {
		return "", ve
	}
	n := string(key)
	if ve := buckets.ValidateAttributeName(n); ve != nil {
		ve.Field = "tag " + shortTag(n)
		ve.Msg += " (tags are attributes of the device)"
		m.badAttr[n] = ve
		return "", ve
	}
	m.attrOK[n] = n
	return n, nil
}

// attrValueOK is the test of buckets.ValidateAttributeValue without
// the cost of its error, for every tag of every line.
func attrValueOK(v string) bool {
	return v != "" && len(v) <= buckets.MaxAttributeValueBytes && utf8.ValidString(v)
}

func shortTag(key string) string {
	if len(key) > buckets.MaxAttributeNameBytes {
		return key[:16] + "..."
	}
	return key
}

// newAttrNames counts the names of m.attrs the device's earlier lines
// (g, nil when none) did not give.
func (m *mapper) newAttrNames(g *deviceReadings) int {
	if g == nil {
		return len(m.attrs)
	}
	n := 0
	for _, a := range m.attrs {
		if _, found := slices.BinarySearch(g.attrNames, a.Name); !found {
			n++
		}
	}
	return n
}

// addAttrNames records the names of m.attrs as given by the device g.
func (m *mapper) addAttrNames(g *deviceReadings) {
	for _, a := range m.attrs {
		if i, found := slices.BinarySearch(g.attrNames, a.Name); !found {
			g.attrNames = slices.Insert(g.attrNames, i, a.Name)
		}
	}
}

// attrConflict reports the first of attrs (sorted by name) that an
// earlier line of the same device and time gave another value, and
// counts those p lacks.
func (p *pending) attrConflict(attrs []lineAttr) (missing int, _ *buckets.ValidationError) {
	i := 0
	for _, a := range attrs {
		for i < len(p.attrs) && p.attrs[i].Name < a.Name {
			i++
		}
		if i == len(p.attrs) || p.attrs[i].Name != a.Name {
			missing++
			continue
		}
		if p.attrs[i].Value != a.Value {
			return 0, invalid(CodeConflictingLines, "tag "+a.Name,
				"line %d gives the attribute %s the value %q at the same device and time; this line gives %q (tags are attributes of the device)",
				p.attrs[i].line, a.Name, p.attrs[i].Value, a.Value)
		}
	}
	return missing, nil
}

// mergeAttrs adds the attributes of attrs that p lacks (none
// conflicts).
func (p *pending) mergeAttrs(attrs []lineAttr) {
	for _, a := range attrs {
		i, found := slices.BinarySearchFunc(p.attrs, a.Name, func(x lineAttr, n string) int { return strings.Compare(x.Name, n) })
		if !found {
			p.attrs = slices.Insert(p.attrs, i, a)
		}
	}
}

// assignments returns the attribute assignments of the device's
// readings rs (indexes into m.pending): per attribute the value of the
// latest reading that gives it, grouped by that reading's time, in
// time order. nil when no reading has attributes.
func (m *mapper) assignments(g *deviceReadings, rs []int32) []assignmentAt {
	if len(g.attrNames) == 0 {
		return nil
	}
	// g.attrNames is sorted: the newest value of name i goes to newest[i].
	newest := make([]lineAttr, len(g.attrNames))
	at := make([]buckets.Ticks, len(g.attrNames))
	for _, pi := range rs {
		p := &m.pending[pi]
		for _, a := range p.attrs {
			i, _ := slices.BinarySearch(g.attrNames, a.Name)
			if newest[i].Name == "" || p.ticks >= at[i] {
				newest[i], at[i] = a, p.ticks
			}
		}
	}
	order := make([]int, len(newest))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(x, y int) int { return cmp.Compare(at[x], at[y]) })
	set := make(buckets.Attributes, len(order))
	var out []assignmentAt
	start := 0
	for k, i := range order {
		set[k] = newest[i].Attribute
		if k > 0 && at[i] == at[order[k-1]] {
			out[len(out)-1].set = set[start : k+1 : k+1]
			continue
		}
		start = k
		out = append(out, assignmentAt{at: at[i], set: set[k : k+1 : k+1]})
	}
	return out
}

// assignmentAt is one assignment of a device's message.
type assignmentAt struct {
	at  buckets.Ticks
	set buckets.Attributes
}
