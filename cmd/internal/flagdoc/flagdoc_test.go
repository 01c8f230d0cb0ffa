package flagdoc

import (
	"flag"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSplit(t *testing.T) {
	all := flag.NewFlagSet("telemetryd", flag.ContinueOnError)
	dataDir := all.String("data-dir", "./data", "directory")
	hotDays := all.Int("hot-days", 2, "days")
	fleetFlags, tuningFlags := Split(all)

	require.NotNil(t, fleetFlags.Lookup("data-dir"))
	assert.Nil(t, fleetFlags.Lookup("hot-days"))
	require.NotNil(t, tuningFlags.Lookup("hot-days"))
	assert.Nil(t, tuningFlags.Lookup("data-dir"))
	assert.Equal(t, "2", tuningFlags.Lookup("hot-days").DefValue)

	// The copies share the values: setting either sets the other.
	require.NoError(t, all.Parse([]string{"-hot-days", "5"}))
	assert.Equal(t, "5", tuningFlags.Lookup("hot-days").Value.String())
	require.NoError(t, fleetFlags.Set("data-dir", "/srv"))
	assert.Equal(t, "/srv", *dataDir)
	assert.Equal(t, 5, *hotDays)
}

func TestWho(t *testing.T) {
	assert.True(t, Fleet("data-dir"))
	assert.False(t, Fleet("hot-days"))
	assert.NotEmpty(t, Who("hot-days"))
	assert.False(t, Known("no-such-flag"))
	n := 0
	for name := range fleet {
		if name != "version" {
			n++
		}
	}
	assert.LessOrEqual(t, n+1, 30, "the fleet's flags and -version")
	for name := range fleet {
		_, both := tuning[name]
		assert.False(t, both, "%s is in one table", name)
	}
}
