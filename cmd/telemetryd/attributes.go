package main

import (
	"context"
	"fmt"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// attributeStore is the attribute part of the store: the device
// records and the attribute index.
type attributeStore interface {
	api.Attributes
	AttributeNames(ctx context.Context, q buckets.DeviceQuery) ([]string, error)
	AttributeValues(ctx context.Context, name string, q buckets.DeviceQuery) ([]string, error)
}

// attributesOf is st's attribute part, or one that refuses every call
// when st has none.
func attributesOf(st any) attributeStore {
	if a, ok := st.(attributeStore); ok {
		return a
	}
	return noAttributes{}
}

// noAttributes refuses every attribute call.
type noAttributes struct{}

var errNoAttributes = fmt.Errorf("device attributes are not kept by this store: %w", buckets.ErrUnavailable)

func (noAttributes) Device(context.Context, buckets.DeviceID) (buckets.DeviceInfo, error) {
	return buckets.DeviceInfo{}, errNoAttributes
}
func (noAttributes) Assign(context.Context, []buckets.Assignment) error { return errNoAttributes }
func (noAttributes) AttributeNames(context.Context, buckets.DeviceQuery) ([]string, error) {
	return nil, errNoAttributes
}
func (noAttributes) AttributeValues(context.Context, string, buckets.DeviceQuery) ([]string, error) {
	return nil, errNoAttributes
}
