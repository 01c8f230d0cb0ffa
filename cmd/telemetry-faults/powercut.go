package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/telemetryd/telemetryd/cmd/internal/lazyfs"
)

// lazyMount is the disk of one process, a LazyFS mount: a NATS server's
// store or a node's data dir. A power cut of a machine kills its NATS
// server and its node and drops every write to their two disks that was
// not fsynced.
//
// Each process has a disk of its own, not one per machine: LazyFS
// serves a mount's operations behind locks on its whole cache (an
// fsync writes the file's dirty pages back under the cache's exclusive
// lock, and a truncate that grows a file, as Badger does to each new
// value log and memtable, fills the growth with zeros in the cache), so
// on a shared mount a node's Badger held up its NATS server's store:
// JetStream API calls of 2.3 to 3.9 s ("took too long") in the
// servers' logs, while their routes, whose reads may wait on the
// store, have a 10 s write deadline.
type lazyMount struct {
	*lazyfs.FS
	mnt string
}

func (m *lazyMount) close() error { return m.Close() }

// crashed reports whether the LazyFS process has exited (it is
// mounted again by a cut).
func (m *lazyMount) crashed() bool {
	select {
	case <-m.Exited():
		return true
	default:
		return false
	}
}

// mountAll mounts one LazyFS per process under work: NATS server k's
// at index k, node k's at servers+k (their members).
func (c *cluster) mountAll(ctx context.Context, work string) error {
	c.lfs = make([]*lazyMount, 2*servers)
	var wg sync.WaitGroup
	errs := make([]error, 2*servers)
	for m := range 2 * servers {
		name, size := fmt.Sprintf("nats-%d", m), c.cfg.NATSCache
		if m >= servers {
			name, size = fmt.Sprintf("node-%d", m-servers), c.cfg.LazyFSCache
		}
		fs, err := lazyfs.NewSized(c.cfg.LazyFS, filepath.Join(work, "lazyfs-"+name), filepath.Join(work, "disk-"+name), size, c.log)
		if err != nil {
			errs[m] = err
			break
		}
		c.lfs[m] = &lazyMount{FS: fs, mnt: fs.Mnt}
		// At once: LazyFS allocates its whole cache before it mounts,
		// which takes seconds each on a busy machine.
		wg.Go(func() { errs[m] = fs.Mount(ctx) })
	}
	// Every mount started is waited for, failures and ctrl-C included:
	// close must not run beside a Mount that is still starting LazyFS.
	wg.Wait()
	return errors.Join(errs...)
}

// powerCut cuts the power of the machines ks at once: their NATS servers
// and nodes are SIGKILLed, every write to their disks that was not
// fsynced is dropped (with LazyFS; without, nothing is: a crash), and
// they start again (the NATS servers first).
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
	var wg sync.WaitGroup
	errs := make([]error, 2*servers)
	c.diskMu.Lock() // watchDisks waits for the new LazyFS processes
	for _, k := range ks {
		if c.lfs == nil {
			break // a crash: the kernel keeps every write
		}
		for _, m := range []int{k, servers + k} {
			wg.Go(func() {
				if err := c.lfs[m].Cut(ctx); err != nil {
					errs[m] = fmt.Errorf("power cut of machine %d (%s): %w", k, c.net.members[m], err)
				}
			})
		}
	}
	wg.Wait()
	c.diskMu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return err
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

// startAfterCut starts node k after a power cut and waits until it is
// ready, starting it again each time it exits, for up to restartPatience,
// as a supervisor would: after a cut the NATS servers answer before
// their streams have leaders again, and a node whose start times out
// waiting for them exits. f notes how many starts were refused and the
// first refusal; a node not ready after restartPatience fails the run.
func (c *cluster) startAfterCut(ctx context.Context, k int, f *fault) error {
	return c.startSupervised(ctx, k, f)
}

// restartPatience is how long the harness, as a supervisor, starts a
// node again and again before it gives up.
const restartPatience = 10 * time.Minute

// startSupervised starts node j until it is ready (see startAfterCut).
func (c *cluster) startSupervised(ctx context.Context, j int, f *fault) error {
	p := c.nodes[j]
	began := time.Now()
	var err error
	refused := 0
	for {
		if err = p.start(); err != nil {
			return err
		}
		if err = c.readyRepairing(ctx, j, 3*time.Minute); err == nil {
			break
		}
		refused++
		if refused == 1 {
			f.What += fmt.Sprintf("; %s start refused (%s)", p.name, lastLine(p.lastLines(1)))
		}
		if kerr := p.kill(); kerr != nil {
			return kerr
		}
		if d := c.crashedDisks(); len(d) > 0 {
			// Waiting is in vain while a disk is gone: the fault loop
			// cuts that machine's power first (diskCrashes).
			return fmt.Errorf("%s not ready: the LazyFS of %s exited: %w", p.name, c.net.members[d[0]], err)
		}
		if time.Since(began) > restartPatience || ctx.Err() != nil {
			return fmt.Errorf("%s not ready %s after the fault, %d starts refused: %w", p.name, time.Since(began).Round(time.Second), refused, err)
		}
		sleepCtx(ctx, time.Second)
	}
	if refused > 0 {
		f.What += fmt.Sprintf("; %s ready after %d refused starts, %s", p.name, refused, time.Since(began).Round(time.Second))
	}
	return nil
}
