package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"syscall"
	"time"
)

// recoverFrom puts the cluster back together after a fault that failed
// half-way, so that the schedule can go on and the checks can be made:
// a process that did not exit after its SIGKILL hangs in the kernel,
// on a LazyFS that stopped answering (its cache full); killing that
// LazyFS fails the process's pending file operations, the process
// exits, and the machine's power is cut as after any LazyFS exit
// (diskCrashes), which drops nothing more than the dead LazyFS did.
// Then every network fault is removed, every paused process resumed,
// every process that is down started, and every node waited for. f
// notes what was done; an error means the cluster is still not whole.
func (c *cluster) recoverFrom(ctx context.Context, f *fault, res *Result) error {
	var errs []error
	for _, p := range append(slices.Clone(c.nats), c.nodes...) {
		if !p.hung() {
			continue
		}
		if c.lfs == nil || c.lfs[p.member] == nil {
			errs = append(errs, fmt.Errorf("%s hangs after SIGKILL and is on no LazyFS the harness can kill", p.name))
			continue
		}
		f.What += fmt.Sprintf("; %s hung after SIGKILL: its LazyFS killed", p.name)
		if err := c.killDisk(p.member); err != nil {
			errs = append(errs, err)
			continue
		}
		if !p.waitExit(killWait) {
			errs = append(errs, fmt.Errorf("%s still hangs %s after its LazyFS was killed", p.name, killWait))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := c.diskCrashes(ctx, res); err != nil {
		return err
	}
	if err := c.healAll(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	for j, p := range c.nodes {
		if err := c.readyRepairing(ctx, j, 2*time.Minute); err == nil {
			continue
		}
		if err := p.kill(); err != nil {
			return err
		}
		if err := c.startSupervised(ctx, j, f); err != nil {
			return err
		}
	}
	f.What += "; recovered"
	return nil
}

// killDisk SIGKILLs the LazyFS process of member m and waits until it
// is gone; its mount then fails every operation (ENOTCONN) until the
// power cut mounts it again.
func (c *cluster) killDisk(m int) error {
	l := c.lfs[m]
	if l.crashed() {
		return nil
	}
	c.diskMu.Lock()
	pids := l.Pids()
	c.diskMu.Unlock()
	if len(pids) == 0 {
		return fmt.Errorf("LazyFS of %s: never started", c.net.members[m])
	}
	if err := syscall.Kill(pids[len(pids)-1], syscall.SIGKILL); err != nil {
		return fmt.Errorf("kill LazyFS of %s: %w", c.net.members[m], err)
	}
	select {
	case <-l.Exited():
		return nil
	case <-time.After(killWait):
		return fmt.Errorf("LazyFS of %s did not exit within %s of SIGKILL", c.net.members[m], killWait)
	}
}
