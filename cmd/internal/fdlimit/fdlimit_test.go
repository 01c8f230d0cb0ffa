package fdlimit

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestSplit(t *testing.T) {
	h, n := Split(1<<20, 1024)
	assert.Equal(t, 1024, h, "HTTP keeps its cap when there is room")
	assert.Equal(t, 1<<20-StoreReserve-miscReserve-1024, n, "NATS gets the rest")

	h, n = Split(StoreReserve+miscReserve+1000, 1024)
	assert.Equal(t, 500, h, "HTTP gets at most half of what is left")
	assert.Equal(t, 500, n)

	h, n = Split(1024, 0)
	assert.Equal(t, 16, h, "never below 16")
	assert.Equal(t, 16, n)
}
