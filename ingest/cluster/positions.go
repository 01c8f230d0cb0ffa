package cluster

import (
	"context"
	"strconv"

	"github.com/telemetryd/telemetryd/buckets"
)

// PositionStore keeps saved stream positions (ingest.Positions, met by
// store.Store).
type PositionStore interface {
	LoadPosition(ctx context.Context, stream string) (buckets.StreamPosition, bool, error)
	SavePosition(ctx context.Context, pos buckets.StreamPosition) error
}

// Positions keeps one saved stream position per partition in the
// store, under "<stream>/p<N>", for a partition consumer
// (ingest.Config.Positions).
type Positions struct {
	Store     PositionStore
	Partition int
}

func (pp Positions) key(stream string) string { return stream + "/p" + strconv.Itoa(pp.Partition) }

// LoadPosition returns the partition's saved position of stream.
func (pp Positions) LoadPosition(ctx context.Context, stream string) (buckets.StreamPosition, bool, error) {
	pos, ok, err := pp.Store.LoadPosition(ctx, pp.key(stream))
	pos.Stream = stream
	return pos, ok, err
}

// SavePosition saves the partition's position of pos.Stream.
func (pp Positions) SavePosition(ctx context.Context, pos buckets.StreamPosition) error {
	pos.Stream = pp.key(pos.Stream)
	return pp.Store.SavePosition(ctx, pos)
}
