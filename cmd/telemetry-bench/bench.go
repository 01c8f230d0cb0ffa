package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
)

// Results is everything one run measured. Parts that were not run (or
// failed) are zero.
type Results struct {
	Config            Config
	Machine           machine
	Started           time.Time
	Elapsed           time.Duration
	LoadEnd           string  // /proc/loadavg when the run ended
	RawBadger         float64 // readings/s, the best of RawBadgerVariants
	RawBadgerVariants []rawVariant
	RawJS             []jsResult // at 1 and 100 readings per message
	StoreWrite        float64    // readings/s through store.Write
	E2E               []e2eResult
	Query             *queryResult
	Connect           []connectResult // the "connect" phase
	TSBS              []tsbsE2E       // the "tsbs" phase, in the order run
	TSBSData          tsbsData
}

// bench is one run in progress.
type bench struct {
	cfg     Config
	prog    *progress
	work    string
	bin     string
	devices []buckets.DeviceID
	res     *Results
}

// Run measures every part of cfg.Phases, writing progress lines to
// progressOut. On error it returns what was measured so far.
func Run(ctx context.Context, cfg Config, progressOut io.Writer) (*Results, error) {
	b := &bench{cfg: cfg, prog: newProgress(progressOut, cfg.Progress), devices: deviceIDs(cfg.Devices),
		res: &Results{Config: cfg, Machine: describeMachine(), Started: time.Now()}}
	work := cfg.WorkDir
	if work == "" {
		dir, err := os.MkdirTemp("", "telemetry-bench-")
		if err != nil {
			return nil, err
		}
		work = dir
		defer removeAll(dir, cfg.Keep)
	} else if err := os.MkdirAll(work, 0o755); err != nil {
		return nil, err
	}
	b.work, b.bin = work, cfg.Binary
	b.prog.logf("work dir %s; %d readings per ingest measurement over %d devices, %d query readings, %d queries per figure",
		work, cfg.Readings, cfg.Devices, cfg.QueryReadings, cfg.Queries)
	steps := []struct {
		name string
		run  func(context.Context) error
	}{{"raw", b.runRaw}, {"store", b.runStore}, {"e2e", b.runAllE2E}, {"query", b.runQueryPhase}, {"connect", b.runConnect}, {"tsbs", b.runTSBSE2E}}
	for _, st := range steps {
		if !slices.Contains(cfg.Phases, st.name) {
			continue
		}
		if err := st.run(ctx); err != nil {
			b.res.Elapsed, b.res.LoadEnd = time.Since(b.res.Started), loadavg()
			return b.res, fmt.Errorf("%s: %w", st.name, err)
		}
	}
	b.res.Elapsed, b.res.LoadEnd = time.Since(b.res.Started), loadavg()
	b.prog.logf("finished in %s", b.res.Elapsed.Round(time.Second))
	return b.res, nil
}

// ingestWorkload is the workload of the ingest measurements at perMsg
// readings per message: one reading per second per device, ending a
// minute ago.
func (b *bench) ingestWorkload(perMsg int) workload {
	return newWorkload(b.devices, b.cfg.Readings, perMsg, time.Second, time.Now().Add(-time.Minute))
}

// runRaw measures the raw ceilings.
func (b *bench) runRaw(ctx context.Context) error {
	w := b.ingestWorkload(1)
	for _, v := range rawVariants() {
		dir := filepath.Join(b.work, "raw-badger")
		ph := b.prog.begin("raw Badger, "+v.Name, w.readings(), "readings")
		rate, err := rawBadger(dir, w, v, ph)
		removeAll(dir, b.cfg.Keep)
		if err != nil {
			return err
		}
		v.Rate = rate
		b.res.RawBadgerVariants = append(b.res.RawBadgerVariants, v)
		b.res.RawBadger = max(b.res.RawBadger, rate)
		ph.end(fmt.Sprintf("%.0f readings/s", rate))
	}
	for _, perMsg := range []int{1, 100} {
		dir := filepath.Join(b.work, fmt.Sprintf("raw-jetstream-%d", perMsg))
		r, err := rawJetStream(ctx, dir, b.ingestWorkload(perMsg), b.prog)
		removeAll(dir, b.cfg.Keep)
		if err != nil {
			return err
		}
		b.res.RawJS = append(b.res.RawJS, r)
	}
	return nil
}

// runStore measures store.Write.
func (b *bench) runStore(ctx context.Context) error {
	w := b.ingestWorkload(1)
	dir := filepath.Join(b.work, "store")
	ph := b.prog.begin(fmt.Sprintf("store.Write, %d readings per call", storeBatch), w.readings(), "readings")
	rate, err := storeWrite(ctx, dir, w, ph)
	removeAll(dir, b.cfg.Keep)
	if err != nil {
		return err
	}
	b.res.StoreWrite = rate
	ph.end(fmt.Sprintf("%.0f readings/s", rate))
	return nil
}

// runAllE2E runs every end-to-end configuration.
func (b *bench) runAllE2E(ctx context.Context) error {
	if err := b.ensureBinary(ctx); err != nil {
		return err
	}
	runs := slices.DeleteFunc(e2eRuns(), func(r e2eRun) bool {
		return len(b.cfg.Runs) > 0 && !slices.Contains(b.cfg.Runs, r.Name)
	})
	for _, run := range e2eSchedule(runs, b.cfg.Repeat) {
		r, err := b.runE2E(ctx, run)
		removeAll(filepath.Join(b.work, "e2e-"+sanitize(run.Name)), b.cfg.Keep)
		if err != nil {
			return fmt.Errorf("%s: %w", run.Name, err)
		}
		b.res.E2E = append(b.res.E2E, r)
	}
	return nil
}

// runQueryPhase runs the query measurement.
func (b *bench) runQueryPhase(ctx context.Context) error {
	if err := b.ensureBinary(ctx); err != nil {
		return err
	}
	q, err := b.runQuery(ctx)
	removeAll(filepath.Join(b.work, "query"), b.cfg.Keep)
	if err != nil {
		return err
	}
	b.res.Query = q
	return nil
}

// ensureBinary builds telemetryd unless a binary was given.
func (b *bench) ensureBinary(ctx context.Context) error {
	if b.bin != "" {
		return nil
	}
	ph := b.prog.begin("go build ./cmd/telemetryd", 0, "")
	bin, err := buildService(ctx, b.work)
	if err != nil {
		return err
	}
	b.bin = bin
	ph.end(bin)
	return nil
}
