package compactplan

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Size tiers are a factor of sixteen: 1-15, 16-255, 256-4095, 4096.
func TestTierBoundaries(t *testing.T) {
	for count, want := range map[int]int{1: 0, 15: 0, 16: 1, 255: 1, 256: 2, 4095: 2, 4096: 3} {
		assert.Equal(t, want, TierOf(count), "TierOf(%d)", count)
	}
}
