package testhook

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClockOffsetEnv(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == ClockOffsetEnv {
				return v
			}
			return ""
		}
	}
	now, d, err := Clock(env(""))
	require.NoError(t, err)
	assert.Zero(t, d)
	assert.WithinDuration(t, time.Now(), now(), time.Second)
	now, d, err = Clock(env("-1m"))
	require.NoError(t, err)
	assert.Equal(t, -time.Minute, d)
	assert.WithinDuration(t, time.Now().Add(-time.Minute), now(), time.Second)
	_, _, err = Clock(env("24h"))
	require.NoError(t, err, "the bound itself")
	for _, bad := range []string{"a minute", "1", "24h0m1s", "-25h"} {
		_, _, err := Clock(env(bad))
		require.Error(t, err, bad)
		assert.Contains(t, err.Error(), ClockOffsetEnv+"=\""+bad+"\"")
	}
}
