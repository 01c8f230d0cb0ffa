package main

import (
	"context"
	"errors"
)

// lazyMount is a LazyFS mount holding one machine's data: its node's
// data dir and its NATS server's store.
type lazyMount struct {
	mnt string
}

func (m *lazyMount) close() error { return nil }

// errNoPowerCuts: power cuts are not implemented by this harness yet.
var errNoPowerCuts = errors.New("power cuts (-lazyfs) are not supported yet")

func (c *cluster) mountAll(context.Context, string) error { return errNoPowerCuts }

func (c *cluster) powerCut(context.Context, []int) error { return errNoPowerCuts }
