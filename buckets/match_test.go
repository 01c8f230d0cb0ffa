package buckets

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMatcher(t *testing.T) {
	tests := []struct {
		typ          MatchType
		value        string
		match, other []string
		set          []string
		str          string
	}{
		{MatchEqual, "East", []string{"East"}, []string{"", "east", "Eastern"}, nil, `fleet="East"`},
		{MatchNotEqual, "East", []string{"", "West"}, []string{"East"}, nil, `fleet!="East"`},
		{MatchRegexp, "F-.*", []string{"F-", "F-1", "F-\n2"}, []string{"", "xF-1", "f-1"}, nil, `fleet=~"F-.*"`},
		{MatchRegexp, "East|West", []string{"East", "West"}, []string{"", "EastWest", "Eas"}, []string{"East", "West"}, `fleet=~"East|West"`},
		{MatchRegexp, "a|b|c", []string{"a", "c"}, []string{"d", "ab"}, []string{"a", "b", "c"}, `fleet=~"a|b|c"`},
		{MatchRegexp, "foo|foobar|(baz)", []string{"foo", "foobar", "baz"}, []string{"fooba"}, []string{"baz", "foo", "foobar"}, ""},
		{MatchRegexp, "x[12]y?", []string{"x1", "x2y"}, []string{"x3"}, []string{"x1", "x1y", "x2", "x2y"}, ""},
		{MatchRegexp, "(?i)east", []string{"EAST", "east"}, []string{"west"}, nil, ""},
		{MatchRegexp, "", []string{""}, []string{"a"}, []string{""}, `fleet=~""`},
		{MatchNotRegexp, "East|West", []string{"", "North"}, []string{"East", "West"}, nil, `fleet!~"East|West"`},
		{MatchEqual, "a\"b", []string{"a\"b"}, nil, nil, `fleet="a\"b"`},
	}
	for _, tc := range tests {
		t.Run(tc.typ.String()+tc.value, func(t *testing.T) {
			m, err := NewMatcher(tc.typ, "fleet", tc.value)
			require.NoError(t, err)
			for _, v := range tc.match {
				assert.True(t, m.Matches(v), "%s matches %q", m, v)
			}
			for _, v := range tc.other {
				assert.False(t, m.Matches(v), "%s does not match %q", m, v)
			}
			assert.Equal(t, tc.set, m.SetMatches())
			for _, v := range m.SetMatches() {
				assert.True(t, m.Matches(v), "%s matches its set member %q", m, v)
			}
			if tc.str != "" {
				assert.Equal(t, tc.str, m.String())
			}
		})
	}
}

func TestMatcherSetBound(t *testing.T) {
	m, err := NewMatcher(MatchRegexp, "fleet", "[a-p][a-p]") // 256 values
	require.NoError(t, err)
	assert.Len(t, m.SetMatches(), maxSetMatches)
	m, err = NewMatcher(MatchRegexp, "fleet", "[a-q][a-p]") // 272 values
	require.NoError(t, err)
	assert.Nil(t, m.SetMatches(), "more than maxSetMatches values are not listed")
	assert.True(t, m.Matches("qp"))
}

func TestMatcherInvalid(t *testing.T) {
	_, err := NewMatcher(MatchRegexp, "fleet", "(")
	require.ErrorIs(t, err, ErrInvalidArgument)
	assert.ErrorContains(t, err, "fleet")
	_, err = NewMatcher(MatchType(7), "fleet", "x")
	require.ErrorIs(t, err, ErrInvalidArgument)
}
