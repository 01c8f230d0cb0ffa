package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/telemetryd/telemetryd/cmd/internal/lazyfs"
)

// lazyMount is the disk of one machine, a LazyFS mount: its NATS
// server's store and its node's data dir. A power cut of the machine
// kills both and drops every write to the mount that was not fsynced.
type lazyMount struct {
	*lazyfs.FS
	mnt string
}

func (m *lazyMount) close() error { return m.Close() }

// mountAll mounts one LazyFS per machine under work.
func (c *cluster) mountAll(ctx context.Context, work string) error {
	for k := range servers {
		fs, err := lazyfs.NewSized(c.cfg.LazyFS, filepath.Join(work, fmt.Sprintf("lazyfs-%d", k)), filepath.Join(work, fmt.Sprintf("disk-%d", k)), c.cfg.LazyFSCache, c.log)
		if err != nil {
			return err
		}
		if err := fs.Mount(ctx); err != nil {
			_ = fs.Close()
			return err
		}
		c.lfs = append(c.lfs, &lazyMount{FS: fs, mnt: fs.Mnt})
	}
	return nil
}

// powerCut cuts the power of the machines ks at once: their NATS servers
// and nodes are SIGKILLed, every write to their disks that was not
// fsynced is dropped, and they start again (the NATS servers first).
// A node that does not start in three tries fails the run: in the
// durable mode a power cut must not damage what a node needs to start.
func (c *cluster) powerCut(ctx context.Context, ks []int, f *fault) error {
	for _, k := range ks {
		if err := c.nodes[k].kill(); err != nil {
			return err
		}
		if err := c.nats[k].kill(); err != nil {
			return err
		}
	}
	for _, k := range ks {
		if err := c.lfs[k].Cut(ctx); err != nil {
			return fmt.Errorf("power cut of machine %d: %w", k, err)
		}
	}
	for _, k := range ks {
		if err := c.nats[k].start(); err != nil {
			return err
		}
	}
	if len(ks) == servers {
		if err := c.waitJetStream(ctx, 3*time.Minute); err != nil {
			return err
		}
	}
	for _, k := range ks {
		if err := c.startAfterCut(ctx, k, f); err != nil {
			return err
		}
	}
	return nil
}

// startAfterCut starts node k after a power cut, up to three times, as a
// supervisor would: after a cut of every machine the NATS servers answer
// before their streams have leaders again, and a node whose start times
// out waiting for them exits. f notes every refusal; a node that
// refuses three times fails the run.
func (c *cluster) startAfterCut(ctx context.Context, k int, f *fault) error {
	p := c.nodes[k]
	var err error
	for attempt := range 3 {
		if err = p.start(); err != nil {
			return err
		}
		if err = waitReady(ctx, p, c.urls[k], 3*time.Minute); err == nil {
			return nil
		}
		f.What += fmt.Sprintf("; %s start %d refused (%s)", p.name, attempt+1, lastLine(p.lastLines(1)))
		if kerr := p.kill(); kerr != nil {
			return kerr
		}
	}
	return fmt.Errorf("after the power cut: %w", err)
}
