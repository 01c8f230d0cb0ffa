package main

import (
	"context"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
)

// attributeStore is the attribute part of the store: the device
// records and the attribute index, which the API (api.Attributes) and
// the PromQL API (promapi.AttributeIndex) read.
type attributeStore interface {
	api.Attributes
	AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error)
	AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error)
}

var _ attributeStore = (*store.Store)(nil)
