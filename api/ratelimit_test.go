package api

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api/limit"
)

// A refusal's wait, under half a second at 2/s, is answered as
// Retry-After: 1 (whole seconds, at least one).
func TestRetryAfterOfARefusal(t *testing.T) {
	r := limit.NewRates(2, 1)
	_, _ = r.Allow("t:x")
	_, err := r.Allow("t:x")
	var d *limit.Denied
	require.ErrorAs(t, err, &d)
	assert.Equal(t, "1", retryAfter(d.Wait))
}
