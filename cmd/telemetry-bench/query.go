package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/nats-io/nats.go"

	"github.com/telemetryd/telemetryd/api/cluster/nodewire"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/diskuse"
)

// latestN is the size of a log-tail query; rangeSpan the length of a
// range query (3,600 readings at one reading per second).
const (
	latestN   = 10
	rangeSpan = time.Hour
)

// latency summarizes the durations of one kind of request.
type latency struct {
	N             int
	P50, P99, Max time.Duration
}

func summarize(ds []time.Duration) latency {
	if len(ds) == 0 {
		return latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return latency{N: len(s), P50: at(0.50), P99: at(0.99), Max: s[len(s)-1]}
}

// queryResult is what the query measurement found.
type queryResult struct {
	Readings      int     // prefilled
	Day           string  // the day table that holds them
	RangeReadings int     // readings in each range answer
	PrefillRate   float64 // readings/s through store.Write
	DiskPrefill   int64   // the day table after prefill, store closed
	DiskService   int64   // after the service ran on it and stopped
	DiskCompacted int64   // after a Badger Flatten and close

	RawLatest, RawRange   latency        // Badger prefix seek, read-only DB
	IdleLatest, IdleRange latency        // HTTP, nothing else running
	Loaded                []loadedResult // HTTP while readings are ingested: at full speed, then paced
	PeakRSS               int64          // service VmHWM
	Settle                time.Duration  // until the service was idle after opening the data
}

// waitIdle waits until svc used less than cores CPU over one second (its
// compactions are done), at most limit, and returns how long it waited.
func waitIdle(ctx context.Context, svc *service, cores float64, limit time.Duration) (time.Duration, error) {
	start := time.Now()
	prev, err := svc.stats()
	if err != nil {
		return 0, err
	}
	for time.Since(start) < limit {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Second):
		}
		st, err := svc.stats()
		if err != nil {
			return 0, err
		}
		if (st.cpu - prev.cpu).Seconds() < cores {
			break
		}
		prev = st
	}
	return time.Since(start), nil
}

// queryWorkload is the prefill: one reading per second per device from
// yesterday 01:00 UTC, written in time order.
func queryWorkload(devices []buckets.DeviceID, readings int, now time.Time) (workload, error) {
	w := workload{devices: devices, perMsg: 1, msgs: readings, step: time.Second,
		base: dayStart(now).Add(-23 * time.Hour)}
	if w.span() > 22*time.Hour {
		return w, fmt.Errorf("-query-readings %d over %d devices is more than a day at one reading per second", readings, len(devices))
	}
	return w, nil
}

// runQuery prefills the store, measures the raw Badger reads, then the
// HTTP queries of a service started on a copy of the data: idle and
// under full-speed ingest on the first copy, then under each paced
// ingest rate on a fresh copy each, so that no measurement inherits the
// compactions of another.
func (b *bench) runQuery(ctx context.Context) (*queryResult, error) {
	dir := filepath.Join(b.work, "query")
	prefilled := filepath.Join(dir, "prefilled")
	w, err := queryWorkload(b.devices, b.cfg.QueryReadings, time.Now())
	if err != nil {
		return nil, err
	}
	res := &queryResult{Readings: w.readings(), RangeReadings: min(int(rangeSpan/w.step), w.perDevice())}
	day := buckets.DayOfTime(w.base)
	res.Day = day.String()
	if err := b.prefill(ctx, prefilled, w, res); err != nil {
		return nil, err
	}
	res.DiskPrefill = diskuse.Tree(store.TableDir(prefilled, day))
	// The raw baseline is the same readings as one Badger entry each
	// (rawkey.go, values as nodewire.AppendValues), the layout before
	// blocks, in a directory of its own.
	rawDir := filepath.Join(dir, "raw")
	ph := b.prog.begin("raw Badger one entry per reading, for the raw queries", w.readings(), "readings")
	if _, err := rawBadger(rawDir, w, rawVariants()[0], ph); err != nil {
		return nil, err
	}
	ph.end("")
	err = b.rawQueries(rawDir, w, res)
	removeAll(rawDir, b.cfg.Keep)
	if err != nil {
		return nil, err
	}
	for i, rate := range append([]int{0}, b.cfg.PacedRates...) {
		runDir := filepath.Join(dir, fmt.Sprintf("run-%d", i))
		if err := os.CopyFS(filepath.Join(runDir, "data"), os.DirFS(prefilled)); err != nil {
			return nil, fmt.Errorf("copy the prefilled data: %w", err)
		}
		err := b.queryRun(ctx, runDir, w, res, rate, i == 0)
		if err == nil && i == 0 {
			err = b.measureDisk(store.TableDir(filepath.Join(runDir, "data"), day), res)
		}
		removeAll(runDir, b.cfg.Keep)
		if err != nil {
			return nil, err
		}
	}
	return res, nil
}

// measureDisk records the size of the day table after the service ran
// on it, then after a Badger Flatten.
func (b *bench) measureDisk(tableDir string, res *queryResult) error {
	res.DiskService = diskuse.Tree(tableDir)
	ph := b.prog.begin("compact the day table (Flatten)", 0, "")
	if err := flatten(tableDir); err != nil {
		return err
	}
	res.DiskCompacted = diskuse.Tree(tableDir)
	ph.end(fmt.Sprintf("%.1f bytes/reading", float64(res.DiskCompacted)/float64(res.Readings)))
	return nil
}

// prefill writes w into a store in dataDir with store.Write.
func (b *bench) prefill(ctx context.Context, dataDir string, w workload, res *queryResult) error {
	ph := b.prog.begin(fmt.Sprintf("prefill %d readings through store.Write", w.readings()), w.readings(), "readings")
	opts := store.DefaultOptions()
	opts.Logger = quietLogger()
	s, err := store.Open(ctx, dataDir, opts)
	if err != nil {
		return err
	}
	rate, err := writeWorkload(ctx, s, w, ph)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	res.PrefillRate = rate
	ph.end(fmt.Sprintf("%.0f readings/s", rate))
	return nil
}

// rawQueries measures latest-10 and the 1-hour range as Badger prefix
// seeks on a day table of one entry per reading (tableDir), opened
// read-only.
func (b *bench) rawQueries(tableDir string, w workload, res *queryResult) error {
	db, err := badger.Open(store.TableBadgerOptions(tableDir, false, true, quietLogger()))
	if err != nil {
		return fmt.Errorf("open day table read-only: %w", err)
	}
	defer db.Close()
	rng := rand.New(rand.NewPCG(1, 1))
	ph := b.prog.begin("raw Badger latest-10 and 1-hour range", 2*b.cfg.Queries, "queries")
	n := 0
	res.RawLatest, err = timeN(b.cfg.Queries, ph, func() error {
		n, err = rawScan(db, w.devices[rng.IntN(len(w.devices))], 0, buckets.MaxTicks+1, latestN)
		return wantCount(n, err, min(latestN, w.perDevice()))
	})
	if err != nil {
		return err
	}
	res.RawRange, err = timeN(b.cfg.Queries, ph, func() error {
		from, to := randomHour(rng, w, res.RangeReadings)
		n, err = rawScan(db, w.devices[rng.IntN(len(w.devices))], from, to, res.RangeReadings+1)
		return wantCount(n, err, res.RangeReadings)
	})
	ph.end(fmt.Sprintf("latest p99 %s, range p99 %s", res.RawLatest.P99, res.RawRange.P99))
	return err
}

// rawScan reads up to limit readings of dev with from <= ticks < to,
// newest first, and decodes their values: what the store does for one
// day table, without the store.
func rawScan(db *badger.DB, dev buckets.DeviceID, from, to buckets.Ticks, limit int) (int, error) {
	txn := db.NewTransaction(false)
	defer txn.Discard()
	prefix := rawPrefix(dev)
	it := txn.NewIterator(badger.IteratorOptions{Prefix: prefix})
	defer it.Close()
	n := 0
	for it.Seek(appendRawKey(nil, dev, min(to-1, buckets.MaxTicks))); it.Valid() && n < limit; it.Next() {
		key := it.Item().Key()
		k := buckets.TicksFromInverted(binary.BigEndian.Uint64(key[len(prefix):]))
		if k < from {
			break
		}
		if err := it.Item().Value(func(v []byte) error {
			_, err := nodewire.DecodeValues(v)
			return err
		}); err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// randomHour picks a span of n readings of w at random.
func randomHour(rng *rand.Rand, w workload, n int) (from, to buckets.Ticks) {
	k := rng.IntN(w.perDevice() - n + 1)
	start := w.base.Add(time.Duration(k) * w.step)
	return buckets.MustTicks(start), buckets.MustTicks(start.Add(time.Duration(n) * w.step))
}

func wantCount(n int, err error, want int) error {
	if err == nil && n != want {
		err = fmt.Errorf("got %d readings, want %d", n, want)
	}
	return err
}

// timeN runs f n times in a row and summarizes how long each took.
func timeN(n int, ph *phase, f func() error) (latency, error) {
	ds := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			return latency{}, err
		}
		ds = append(ds, time.Since(start))
		ph.add(1)
	}
	return summarize(ds), nil
}

// queryRun starts the service on the data in dir, waits until it is
// idle, measures the idle queries when idle is set, then the queries
// while readings are ingested (at full speed when rate is 0).
func (b *bench) queryRun(ctx context.Context, dir string, w workload, res *queryResult, rate int, idle bool) error {
	svc := &service{bin: b.bin, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "telemetryd.log"),
		telemetry: true}
	if b.cfg.ProfileDir != "" && rate == 0 {
		addr, err := freeAddr()
		if err != nil {
			return err
		}
		svc.pprofAddr = addr
	}
	if err := svc.start(ctx); err != nil {
		return err
	}
	defer svc.stop(30 * time.Second)
	q := &querier{svc: svc, w: w, rangeN: res.RangeReadings, rng: rand.New(rand.NewPCG(2, 2))}
	if err := q.check(ctx); err != nil {
		return err
	}
	ph := b.prog.begin("wait for the service to go idle (compactions after opening the prefilled table)", 0, "")
	settle, err := waitIdle(ctx, svc, 0.05, 3*time.Minute)
	if err != nil {
		return err
	}
	res.Settle = max(res.Settle, settle)
	ph.end(settle.Round(time.Second).String())
	if _, err := timeN(b.cfg.Queries/5, nil, func() error { return q.latest(ctx) }); err != nil { // warm up
		return err
	}
	if idle {
		ph = b.prog.begin("HTTP queries, idle", 2*b.cfg.Queries, "queries")
		if res.IdleLatest, err = timeN(b.cfg.Queries, ph, func() error { return q.latest(ctx) }); err != nil {
			return err
		}
		if res.IdleRange, err = timeN(b.cfg.Queries, ph, func() error { return q.hour(ctx) }); err != nil {
			return err
		}
		ph.end(fmt.Sprintf("latest p99 %s, range p99 %s", res.IdleLatest.P99, res.IdleRange.P99))
	}
	l, err := b.loadedQueries(ctx, svc, q, rate)
	if err != nil {
		return err
	}
	res.Loaded = append(res.Loaded, l)
	st, err := svc.stats()
	if err != nil {
		return err
	}
	res.PeakRSS = max(res.PeakRSS, st.hwm)
	return svc.stop(30 * time.Second)
}

// loadedResult is what the queries measured under one ingest rate.
type loadedResult struct {
	Target        int     // readings/s the publisher was paced at; 0: full speed
	Rate          float64 // readings/s stored while the queries ran (over one second at least)
	Cores         float64 // service CPU time / wall time while they ran
	Latest, Range latency
}

// name says how fast readings were ingested.
func (l loadedResult) name() string {
	if l.Target > 0 {
		return "ingest paced at " + num(float64(l.Target)) + "/s"
	}
	return "full-speed ingest"
}

// loadedQueries measures the queries while a publisher ingests 100-
// reading messages for the same devices as fast as the service takes
// them, or at rate readings/s when rate > 0.
func (b *bench) loadedQueries(ctx context.Context, svc *service, q *querier, rate int) (loadedResult, error) {
	res := loadedResult{Target: rate}
	stopLoad, err := startLoad(ctx, svc, b.devices, float64(rate))
	if err != nil {
		return res, err
	}
	defer stopLoad()
	n0, err := svc.stored(ctx)
	for n := n0; err == nil && n < n0+int64(len(b.devices)*100); time.Sleep(50 * time.Millisecond) {
		n, err = svc.stored(ctx) // wait until ingest is under way
	}
	if err != nil {
		return res, err
	}
	ph := b.prog.begin("HTTP queries under "+res.name(), 2*b.cfg.Queries, "queries")
	stopProfile := func() {}
	if rate == 0 {
		stopProfile = b.profile(ctx, svc, "query-under-ingest")
	}
	defer stopProfile()
	start := time.Now()
	if n0, err = svc.stored(ctx); err != nil {
		return res, err
	}
	st0, err := svc.stats()
	if err != nil {
		return res, err
	}
	if res.Latest, err = timeN(b.cfg.Queries, ph, func() error { return q.latest(ctx) }); err != nil {
		return res, err
	}
	if res.Range, err = timeN(b.cfg.Queries, ph, func() error { return q.hour(ctx) }); err != nil {
		return res, err
	}
	// A short run of queries can end between two commits: the ingest
	// rate is taken over one second at least.
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(time.Second - time.Since(start)):
	}
	n1, err := svc.stored(ctx)
	if err != nil {
		return res, err
	}
	st1, err := svc.stats()
	if err != nil {
		return res, err
	}
	el := time.Since(start).Seconds()
	res.Rate, res.Cores = float64(n1-n0)/el, (st1.cpu-st0.cpu).Seconds()/el
	ph.end(fmt.Sprintf("latest p99 %s, range p99 %s, ingesting %.0f readings/s", res.Latest.P99, res.Range.P99, res.Rate))
	stopProfile()
	return res, stopLoad()
}

// maxBacklog bounds how far the load publisher runs ahead of what the
// service stored: JetStream acks publishes long before the service
// commits them, and an unbounded backlog would fill the stream (memory
// and disk of the embedded server) instead of measuring the service.
const maxBacklog = 500_000

// startLoad publishes 100-reading messages for devices to svc as fast
// as the service stores them (at most maxBacklog readings ahead), or at
// rate readings/s when rate > 0, with timestamps of the last minutes,
// until the returned stop is called. stop waits for the
// publisher and returns its error; it may be called more than once.
func startLoad(ctx context.Context, svc *service, devices []buckets.DeviceID, rate float64) (stop func() error, err error) {
	n0, err := svc.stored(ctx)
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(svc.natsURL())
	if err != nil {
		return nil, err
	}
	load := newWorkload(devices, 100_000*len(devices), 100, 10*time.Millisecond, time.Now().Add(-time.Second))
	lctx, cancel := context.WithCancel(ctx)
	var stored atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() { pollStored(lctx, svc, &stored, n0) })
	pace := func(context.Context, int) error { return nil }
	if rate > 0 {
		pace = pacer(rate)
	}
	hold := func(ctx context.Context, sent int) error {
		for int64(sent)-stored.Load() > maxBacklog {
			if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
				return err
			}
		}
		return pace(ctx, sent)
	}
	var perr error
	wg.Go(func() {
		_, perr = publishAll(lctx, nc, load, hold)
		if isStopped(perr) {
			perr = nil
		}
	})
	var once sync.Once
	return func() error {
		once.Do(func() {
			cancel()
			wg.Wait()
			nc.Close()
			if perr != nil {
				perr = fmt.Errorf("load publisher: %w", perr)
			}
		})
		return perr
	}, nil
}

// pollStored keeps stored at the readings svc stored since it held n0,
// until ctx is done.
func pollStored(ctx context.Context, svc *service, stored *atomic.Int64, n0 int64) {
	for sleepCtx(ctx, 20*time.Millisecond) == nil {
		if n, err := svc.stored(ctx); err == nil {
			stored.Store(n - n0)
		}
	}
}

// sleepCtx sleeps d or until ctx is done (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// querier sends the benchmark's queries to the service.
type querier struct {
	svc    *service
	w      workload
	rangeN int
	rng    *rand.Rand
}

// latest asks for the newest 10 readings of a random device.
func (q *querier) latest(ctx context.Context) error {
	dev := q.w.devices[q.rng.IntN(len(q.w.devices))]
	_, err := q.get(ctx, "/v1/devices/"+string(dev)+"/readings/latest?limit="+strconv.Itoa(latestN), false)
	return err
}

// hour asks for one hour of a random device, in one page.
func (q *querier) hour(ctx context.Context) error {
	_, err := q.get(ctx, q.hourPath(), false)
	return err
}

func (q *querier) hourPath() string {
	dev := q.w.devices[q.rng.IntN(len(q.w.devices))]
	from, to := randomHour(q.rng, q.w, q.rangeN)
	return fmt.Sprintf("/v1/devices/%s/readings?from=%d&to=%d&limit=%d", dev,
		from.Time().UnixMilli(), to.Time().UnixMilli(), q.rangeN)
}

// check verifies once that both queries return what the data holds.
func (q *querier) check(ctx context.Context) error {
	path := "/v1/devices/" + string(q.w.devices[0]) + "/readings/latest?limit=" + strconv.Itoa(latestN)
	n, err := q.get(ctx, path, true)
	if err := wantCount(n, err, min(latestN, q.w.perDevice())); err != nil {
		return fmt.Errorf("latest: %w", err)
	}
	n, err = q.get(ctx, q.hourPath(), true)
	if err := wantCount(n, err, q.rangeN); err != nil {
		return fmt.Errorf("1-hour range: %w", err)
	}
	return nil
}

// get reads the whole answer to GET path; with count it also decodes it
// and returns the number of readings.
func (q *querier) get(ctx context.Context, path string, count bool) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, q.svc.url(path), nil)
	if err != nil {
		return 0, err
	}
	resp, err := q.svc.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return 0, fmt.Errorf("GET %s: %s: %s", path, resp.Status, body)
	}
	if !count {
		_, err := io.Copy(io.Discard, resp.Body)
		return 0, err
	}
	var lr struct {
		Readings []json.RawMessage `json:"readings"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&lr); err != nil {
		return 0, err
	}
	return len(lr.Readings), nil
}

// flatten compacts a day table into one level, as Badger does over time.
func flatten(dir string) error {
	db, err := badger.Open(store.TableBadgerOptions(dir, false, false, quietLogger()))
	if err != nil {
		return fmt.Errorf("open %s: %w", dir, err)
	}
	if err := db.Flatten(2); err != nil {
		_ = db.Close()
		return fmt.Errorf("flatten %s: %w", dir, err)
	}
	return db.Close()
}

// removeAll removes dir unless keep is set.
func removeAll(dir string, keep bool) {
	if !keep {
		_ = os.RemoveAll(dir)
	}
}

// fullSpeed is the loaded result at full-speed ingest, if measured.
func (q *queryResult) fullSpeed() loadedResult {
	for _, l := range q.Loaded {
		if l.Target == 0 {
			return l
		}
	}
	return loadedResult{}
}
