package countfile

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseCount(t *testing.T) {
	tests := []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0\n", 0, true},
		{"1234\n", 1234, true},
		{"9223372036854775807\n", 1<<63 - 1, true}, // 20 bytes: the limit
		{"09223372036854775807\n", 0, false},       // 21 bytes
		{"9223372036854775808\n", 0, false},        // overflows
		{"", 0, false},
		{"\n", 0, false},
		{"12", 0, false},
		{"-1\n", 0, false},
		{"+1\n", 0, false},
		{"1 2\n", 0, false},
		{"12\n\n", 0, false},
		{strings.Repeat("\xde\xad\xbe\xef", 4), 0, false},
	}
	for _, tt := range tests {
		n, err := Parse([]byte(tt.in))
		if !tt.ok {
			assert.Error(t, err, "%q", tt.in)
			continue
		}
		require.NoError(t, err, "%q", tt.in)
		assert.Equal(t, tt.want, n, "%q", tt.in)
	}
}
