package buckets

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"slices"
	"strconv"
	"unicode"
)

// MatchType is how a Matcher compares a value: PromQL's =, !=, =~ and
// !~, in that order (the order of Prometheus' labels.MatchType, so a
// PromQL matcher converts by its number).
type MatchType int

// The match types.
const (
	MatchEqual MatchType = iota
	MatchNotEqual
	MatchRegexp
	MatchNotRegexp
)

// String returns the PromQL operator: =, !=, =~ or !~.
func (t MatchType) String() string {
	switch t {
	case MatchEqual:
		return "="
	case MatchNotEqual:
		return "!="
	case MatchRegexp:
		return "=~"
	case MatchNotRegexp:
		return "!~"
	}
	return "MatchType(" + strconv.Itoa(int(t)) + ")"
}

// Matcher selects devices by one attribute, or by the device ID when
// Name is "device", with PromQL's rules: an attribute a device lacks
// matches as the empty string, and a regular expression must match the
// whole value (it is anchored at both ends, and . matches a newline).
// Build it with NewMatcher.
type Matcher struct {
	Type  MatchType
	Name  string
	Value string
	re    *regexp.Regexp
	set   []string // the values a MatchRegexp matches, when few and known
}

// maxSetMatches bounds the values SetMatches lists.
const maxSetMatches = 256

// NewMatcher returns the matcher name<t>value. A regular expression
// takes RE2 syntax (package regexp), as PromQL's does.
func NewMatcher(t MatchType, name, value string) (*Matcher, error) {
	m := &Matcher{Type: t, Name: name, Value: value}
	switch t {
	case MatchEqual, MatchNotEqual:
	case MatchRegexp, MatchNotRegexp:
		re, err := regexp.Compile("^(?s:" + value + ")$")
		if err != nil {
			return nil, fmt.Errorf("%w: matcher %s: %w", ErrInvalidArgument, name, err)
		}
		m.re = re
		if t == MatchRegexp {
			m.set = literalSet(value)
		}
	default:
		return nil, fmt.Errorf("%w: matcher %s: unknown match type %d", ErrInvalidArgument, name, int(t))
	}
	return m, nil
}

// Matches reports whether v satisfies the matcher.
func (m *Matcher) Matches(v string) bool {
	switch m.Type {
	case MatchEqual:
		return v == m.Value
	case MatchNotEqual:
		return v != m.Value
	case MatchRegexp:
		return m.re.MatchString(v)
	case MatchNotRegexp:
		return !m.re.MatchString(v)
	}
	return false
}

// SetMatches returns, for a MatchRegexp whose expression matches only a
// few literal strings (fleet=~"East|West"), those strings; otherwise
// nil. The caller must not modify it.
func (m *Matcher) SetMatches() []string { return m.set }

// String returns the matcher as PromQL writes it: fleet=~"F-.*".
func (m *Matcher) String() string { return m.Name + m.Type.String() + strconv.Quote(m.Value) }

// literalSet returns the strings the whole of expression expr matches
// when they are at most maxSetMatches, none found by folding case;
// otherwise nil.
func literalSet(expr string) []string {
	re, err := syntax.Parse(expr, syntax.Perl|syntax.DotNL)
	if err != nil {
		return nil
	}
	set, ok := expand(re.Simplify())
	if !ok || len(set) == 0 {
		return nil
	}
	slices.Sort(set)
	return slices.Compact(set)
}

// expand lists the strings re matches; ok is false when they are not a
// finite set of at most maxSetMatches.
func expand(re *syntax.Regexp) (set []string, ok bool) {
	switch re.Op {
	case syntax.OpEmptyMatch:
		return []string{""}, true
	case syntax.OpLiteral:
		if re.Flags&syntax.FoldCase != 0 && hasLetter(re.Rune) {
			return nil, false
		}
		return []string{string(re.Rune)}, true
	case syntax.OpCapture:
		return expand(re.Sub[0])
	case syntax.OpQuest:
		s, ok := expand(re.Sub[0])
		if !ok || len(s)+1 > maxSetMatches {
			return nil, false
		}
		return append(s, ""), true
	case syntax.OpCharClass:
		return expandClass(re.Rune)
	case syntax.OpAlternate:
		for _, sub := range re.Sub {
			s, ok := expand(sub)
			if !ok || len(set)+len(s) > maxSetMatches {
				return nil, false
			}
			set = append(set, s...)
		}
		return set, true
	case syntax.OpConcat:
		set = []string{""}
		for _, sub := range re.Sub {
			s, ok := expand(sub)
			if !ok || len(set)*len(s) > maxSetMatches {
				return nil, false
			}
			next := make([]string, 0, len(set)*len(s))
			for _, a := range set {
				for _, b := range s {
					next = append(next, a+b)
				}
			}
			set = next
		}
		return set, true
	}
	return nil, false
}

// expandClass lists the runes of a character class given as ranges.
func expandClass(ranges []rune) ([]string, bool) {
	var set []string
	for i := 0; i+1 < len(ranges); i += 2 {
		lo, hi := ranges[i], ranges[i+1]
		if int(hi-lo)+1+len(set) > maxSetMatches {
			return nil, false
		}
		for r := lo; r <= hi; r++ {
			set = append(set, string(r))
		}
	}
	return set, true
}

func hasLetter(rs []rune) bool {
	return slices.ContainsFunc(rs, func(r rune) bool { return unicode.SimpleFold(r) != r })
}
