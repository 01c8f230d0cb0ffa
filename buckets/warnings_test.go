package buckets_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/telemetryd/telemetryd/buckets"
)

func TestWarningsAreCollectedOnceAndBounded(t *testing.T) {
	buckets.Warn(context.Background(), "nobody listens") // no collector: nothing happens
	assert.Nil(t, buckets.WarningsOf(context.Background()).List())

	ctx, w := buckets.WithWarnings(context.Background())
	assert.Same(t, w, buckets.WarningsOf(ctx))
	buckets.Warn(ctx, "a")
	buckets.Warn(ctx, "a")
	assert.Equal(t, []string{"a"}, w.List(), "the same warning once")
	for i := range buckets.MaxWarnings + 5 {
		buckets.Warn(ctx, fmt.Sprint(i))
	}
	list := w.List()
	assert.Len(t, list, buckets.MaxWarnings+1)
	assert.Equal(t, "and 6 more warnings", list[buckets.MaxWarnings])
}
