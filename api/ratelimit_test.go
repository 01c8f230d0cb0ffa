package api

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The limiter holds at most maxRateKeys clients: the behaviour Echo's
// memory store lacks, and why this store stays.
func TestRateLimiterKeysAreBounded(t *testing.T) {
	r := newRateLimiter(1, 1)
	now := time.Unix(1_700_000_000, 0)
	for i := range maxRateKeys {
		ok, _ := r.allow("a:"+strconv.Itoa(i), now)
		require.True(t, ok)
	}
	require.Len(t, r.buckets, maxRateKeys)

	// Every bucket is busy: a new client shares the overflow bucket.
	ok, _ := r.allow("a:new-1", now)
	assert.True(t, ok, "the overflow bucket has its burst")
	ok, wait := r.allow("a:new-2", now)
	assert.False(t, ok, "the second new client finds the overflow bucket spent")
	assert.Equal(t, time.Second, wait)
	assert.Len(t, r.buckets, maxRateKeys, "no client is added past the bound")

	// Once the buckets are full again they are forgotten, and a new
	// client gets its own.
	later := now.Add(2 * time.Second)
	ok, _ = r.allow("a:new-3", later)
	assert.True(t, ok)
	assert.Len(t, r.buckets, 1)
}

func TestRateLimiterAllowReportsTheWait(t *testing.T) {
	r := newRateLimiter(2, 1)
	ok, err := r.Allow("t:x")
	require.True(t, ok)
	require.NoError(t, err)
	ok, err = r.Allow("t:x")
	require.False(t, ok)
	var d *rateDenied
	require.ErrorAs(t, err, &d)
	assert.True(t, d.wait > 0 && d.wait <= 500*time.Millisecond, "a token comes back within half a second at 2/s: %s", d.wait)
	assert.Equal(t, "1", retryAfter(d.wait))
}
