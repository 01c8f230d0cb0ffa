package limit

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The limiter holds at most maxKeys clients: the behaviour Echo's
// memory store lacks, and why this store stays.
func TestRateLimiterKeysAreBounded(t *testing.T) {
	r := NewRates(1, 1)
	now := time.Unix(1_700_000_000, 0)
	for i := range maxKeys {
		ok, _ := r.Take("a:"+strconv.Itoa(i), now)
		require.True(t, ok)
	}
	require.Len(t, r.buckets, maxKeys)

	// Every bucket is busy: a new client shares the overflow bucket.
	ok, _ := r.Take("a:new-1", now)
	assert.True(t, ok, "the overflow bucket has its burst")
	ok, wait := r.Take("a:new-2", now)
	assert.False(t, ok, "the second new client finds the overflow bucket spent")
	assert.Equal(t, time.Second, wait)
	assert.Len(t, r.buckets, maxKeys, "no client is added past the bound")

	// Once the buckets are full again they are forgotten, and a new
	// client gets its own.
	later := now.Add(2 * time.Second)
	ok, _ = r.Take("a:new-3", later)
	assert.True(t, ok)
	assert.Len(t, r.buckets, 1)
}

func TestRateLimiterAllowReportsTheWait(t *testing.T) {
	r := NewRates(2, 1)
	ok, err := r.Allow("t:x")
	require.True(t, ok)
	require.NoError(t, err)
	ok, err = r.Allow("t:x")
	require.False(t, ok)
	var d *Denied
	require.ErrorAs(t, err, &d)
	assert.True(t, d.Wait > 0 && d.Wait <= 500*time.Millisecond, "a token comes back within half a second at 2/s: %s", d.Wait)
}
