package store

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The fault points sit where their names say: at BeforeCommit the
// readings are not in the store yet, at AfterCommit they are.
func TestFaultPointsBracketTheCommit(t *testing.T) {
	t.Parallel()
	var ts *testStore
	var seen []FaultPoint
	var stored []int
	ts = newTestStore(t, func(o *Options) {
		o.FaultPoint = func(p FaultPoint) {
			seen = append(seen, p)
			got, err := ts.Latest(context.Background(), "dev", 10)
			require.NoError(t, err)
			stored = append(stored, len(got))
		}
	})
	ts.write(t, series("dev", at(0), 1e9, 3)...)
	assert.Equal(t, []FaultPoint{BeforeCommit, AfterCommit}, seen)
	assert.Equal(t, []int{0, 3}, stored, "nothing before the commit, every reading after it")
}
