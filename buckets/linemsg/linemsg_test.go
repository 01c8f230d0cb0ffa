package linemsg

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParsePrecision(t *testing.T) {
	for _, tc := range []struct {
		s    string
		v1   bool
		want time.Duration
		ok   bool
	}{
		{"", false, time.Nanosecond, true}, {"ns", false, time.Nanosecond, true}, {"us", false, time.Microsecond, true},
		{"ms", false, time.Millisecond, true}, {"s", false, time.Second, true}, {"n", false, 0, false},
		{"m", false, 0, false}, {"h", false, 0, false}, {"u", false, 0, false},
		{"n", true, time.Nanosecond, true}, {"u", true, time.Microsecond, true}, {"m", true, time.Minute, true},
		{"h", true, time.Hour, true}, {"d", true, 0, false}, {"MS", true, 0, false},
	} {
		got, err := ParsePrecision(tc.s, tc.v1)
		if !tc.ok {
			assert.Error(t, err, "%q v1=%v", tc.s, tc.v1)
			continue
		}
		require.NoError(t, err, "%q v1=%v", tc.s, tc.v1)
		assert.Equal(t, tc.want, got)
	}
}
