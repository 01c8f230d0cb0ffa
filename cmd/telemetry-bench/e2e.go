package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/telemetryd/telemetryd/store/diskuse"
)

// e2eRun is one end-to-end configuration.
type e2eRun struct {
	Name      string
	PerMsg    int  // readings per message
	Sync      bool // -sync-writes
	Telemetry bool // false: OTEL_SDK_DISABLED=true
	Repeated  bool // run Config.Repeat times
	// MemoryLimit is the service's -memory-limit; empty: its default.
	MemoryLimit string
	// OneStream runs the service with one readings stream
	// (-stream-partitions 0, the layout before streams per partition).
	OneStream bool
}

// e2eResult is what one end-to-end run measured.
type e2eResult struct {
	Run         e2eRun
	Readings    int
	PublishRate float64       // readings/s from first publish to last JetStream ack
	Rate        float64       // readings/s from first publish until the service stored them all
	Elapsed     time.Duration // first publish until stored
	ServiceCPU  time.Duration // service user+system time over Elapsed
	ClientCPU   time.Duration // this process (the publisher) over Elapsed
	PeakRSS     int64         // service VmHWM at the end
	DiskBytes   int64         // day tables after the service stopped
}

// syncShare: the -sync-writes runs publish this fraction of -readings
// (at least one message per device). With -sync-writes the service
// stores publishes in atomic batches, one fsync each (package
// ingest/intake), so they run as long as the others.
const syncShare = 1

// cpuPerMillion is CPU seconds per million readings.
func cpuPerMillion(d time.Duration, readings int) float64 {
	return d.Seconds() / float64(readings) * 1e6
}

// e2eRuns lists the end-to-end configurations measured. Repeated ones
// run Config.Repeat times, interleaved, and the report shows their
// median; the others run once, after them.
func e2eRuns() []e2eRun {
	var runs []e2eRun
	for _, n := range []int{1, 100} {
		// Each -sync-writes run right after its async twin, repeated
		// with it, so that the two see the same machine.
		runs = append(runs,
			e2eRun{Name: fmt.Sprintf("%d/msg", n), PerMsg: n, Telemetry: true, Repeated: true},
			e2eRun{Name: fmt.Sprintf("%d/msg sync-writes", n), PerMsg: n, Sync: true, Telemetry: true, Repeated: true},
			e2eRun{Name: fmt.Sprintf("%d/msg telemetry off", n), PerMsg: n, Repeated: true},
			e2eRun{Name: fmt.Sprintf("%d/msg one stream", n), PerMsg: n, Telemetry: true, Repeated: true, OneStream: true})
	}
	// The memory budget: the same load under the smallest limit the
	// service is meant for and under a generous one.
	for _, limit := range []string{"512MiB", "4GiB"} {
		runs = append(runs, e2eRun{Name: "100/msg memory-limit " + limit, PerMsg: 100, Telemetry: true, Repeated: true,
			MemoryLimit: limit})
	}
	return append(runs, e2eRun{Name: "10000/msg", PerMsg: 10000, Telemetry: true})
}

// e2eSchedule is the order of the end-to-end runs: the repeated ones
// round-robin, repeat times, then the others.
func e2eSchedule(runs []e2eRun, repeat int) []e2eRun {
	var out []e2eRun
	for range repeat {
		for _, r := range runs {
			if r.Repeated {
				out = append(out, r)
			}
		}
	}
	for _, r := range runs {
		if !r.Repeated {
			out = append(out, r)
		}
	}
	return out
}

// runE2E starts a fresh service, publishes b.cfg.Readings readings with
// run.PerMsg per message over the devices, and measures until the
// service's day tables hold all of them.
func (b *bench) runE2E(ctx context.Context, run e2eRun) (e2eResult, error) {
	readings := b.cfg.Readings
	if run.Sync {
		readings = max(readings/syncShare, len(b.devices)*run.PerMsg)
	}
	w := newWorkload(b.devices, readings, run.PerMsg, time.Second, time.Now().Add(-time.Minute))
	return b.e2eOnce(ctx, run, b.bin, "e2e-"+sanitize(run.Name), w, w.readings())
}

// e2eOnce starts a fresh service from bin in the work dir's name
// directory, publishes msgs and measures until the service's day tables
// hold want readings; then stops the service and measures its tables.
// With -profile-dir the service's CPU profile is saved as name.pprof.
func (b *bench) e2eOnce(ctx context.Context, run e2eRun, bin, name string, msgs messages, want int) (e2eResult, error) {
	svc, err := b.startE2EService(ctx, run, bin, filepath.Join(b.work, name))
	if err != nil {
		return e2eResult{}, err
	}
	defer svc.stop(30 * time.Second)
	nc, err := nats.Connect(svc.natsURL())
	if err != nil {
		return e2eResult{}, err
	}
	defer nc.Close()
	res := e2eResult{Run: run, Readings: want}
	ph := b.prog.begin("end to end "+run.Name+" (stored)", want, "readings")
	defer ph.end("")
	stopProfile := b.profile(ctx, svc, name)
	defer stopProfile()
	if err := measureE2E(ctx, svc, nc, msgs, ph, &res); err != nil {
		return res, err
	}
	ph.end(fmt.Sprintf("%.0f readings/s end to end (publish alone %.0f/s)", res.Rate, res.PublishRate))
	stopProfile()
	if err := svc.stop(30 * time.Second); err != nil {
		return res, err
	}
	res.DiskBytes = diskuse.Tree(filepath.Join(svc.dataDir, "tables"))
	return res, nil
}

// startE2EService starts a fresh service from bin for run in dir.
func (b *bench) startE2EService(ctx context.Context, run e2eRun, bin, dir string) (*service, error) {
	svc := &service{bin: bin, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "telemetryd.log"),
		telemetry: run.Telemetry}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if run.Sync {
		svc.args = append(svc.args, "-sync-writes")
	}
	if run.MemoryLimit != "" {
		svc.args = append(svc.args, "-memory-limit", run.MemoryLimit)
	}
	if run.OneStream {
		svc.args = append(svc.args, "-stream-partitions", "0")
	}
	if b.cfg.ProfileDir != "" {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		svc.pprofAddr = addr
	}
	return svc, svc.start(ctx)
}

// measureE2E publishes w to svc and waits until svc stored res.Readings
// readings, filling in the rates, CPU times and peak RSS of res.
func measureE2E(ctx context.Context, svc *service, nc *nats.Conn, w messages, ph *phase, res *e2eResult) error {
	before, err := svc.stats()
	if err != nil {
		return err
	}
	ru0 := selfCPU()
	start := time.Now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- waitStored(wctx, svc, int64(res.Readings), ph, 50*time.Millisecond) }()
	pub, err := publishAll(ctx, nc, w, nil)
	if err != nil {
		cancel()
		<-waited
		return err
	}
	res.PublishRate = float64(w.readingsBefore(pub.msgs)) / pub.elapsed.Seconds()
	if err := <-waited; err != nil {
		return err
	}
	res.Elapsed = time.Since(start)
	res.ClientCPU = selfCPU() - ru0
	after, err := svc.stats()
	if err != nil {
		return err
	}
	res.Rate = float64(res.Readings) / res.Elapsed.Seconds()
	res.ServiceCPU, res.PeakRSS = after.cpu-before.cpu, after.hwm
	return nil
}

// waitStored polls the service until its tables hold want readings,
// every interval, and every 10 ms once the count is close.
func waitStored(ctx context.Context, svc *service, want int64, ph *phase, interval time.Duration) error {
	deadline := time.Now().Add(30 * time.Minute)
	for time.Now().Before(deadline) {
		n, err := svc.stored(ctx)
		if err != nil {
			return fmt.Errorf("poll stored readings: %w", err)
		}
		if ph != nil {
			ph.set(n)
		}
		if n >= want {
			return nil
		}
		wait := interval
		if n >= want*9/10 {
			wait = 10 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
	return fmt.Errorf("service did not store %d readings within 30 minutes", want)
}

// selfCPU is the CPU time this process used so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// profile fetches a CPU profile of the service for ProfileSeconds, and
// then an execution trace of up to three seconds, into ProfileDir when profiling
// is on. The returned func waits for both.
func (b *bench) profile(ctx context.Context, svc *service, name string) func() {
	if b.cfg.ProfileDir == "" || svc.pprofAddr == "" {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, p := range []struct{ query, file string }{
			{fmt.Sprintf("profile?seconds=%d", b.cfg.ProfileSeconds), name + ".pprof"},
			{fmt.Sprintf("trace?seconds=%d", min(b.cfg.ProfileSeconds, 3)), name + ".trace"},
		} {
			if !b.saveProfile(ctx, svc, name, p.query, p.file) {
				return
			}
		}
	}()
	return func() { <-done }
}

// saveProfile fetches the service's /debug/pprof/query into file in
// ProfileDir and logs where it went, or why it did not; it reports
// whether it did.
func (b *bench) saveProfile(ctx context.Context, svc *service, name, query, file string) bool {
	path := filepath.Join(b.cfg.ProfileDir, file)
	if err := fetchProfile(ctx, svc.pprofAddr, query, path); err != nil {
		b.prog.logf("profile %s: %v", name, err)
		return false
	}
	b.prog.logf("profile written to %s", path)
	return true
}

// traceFor, when profiling is on, saves an execution trace and a CPU
// profile of the service's next d into ProfileDir as name.trace and
// name.pprof (what requests waited on: a processor, a lock, the disk;
// and what else used the processors meanwhile). The returned func
// waits for both.
func (b *bench) traceFor(ctx context.Context, svc *service, name string, d time.Duration) func() {
	if b.cfg.ProfileDir == "" || svc.pprofAddr == "" {
		return func() {}
	}
	var wg sync.WaitGroup
	for _, p := range []struct{ query, file string }{
		{fmt.Sprintf("trace?seconds=%g", d.Seconds()), name + ".trace"},
		{fmt.Sprintf("profile?seconds=%g", d.Seconds()), name + ".pprof"},
	} {
		wg.Go(func() { b.saveProfile(ctx, svc, name, p.query, p.file) })
	}
	return wg.Wait
}

// heapAtPeak, when profiling is on, samples the service's RSS every
// 200 ms and, each time it passes its highest yet by more than 2%,
// saves the heap profile (name.heap.pprof) and the same as text with
// the runtime's memory statistics (name.heap.txt) into ProfileDir, so
// the files left describe the heap at about the peak. The returned func
// stops it and waits.
func (b *bench) heapAtPeak(ctx context.Context, svc *service, name string) func() {
	if b.cfg.ProfileDir == "" || svc.pprofAddr == "" {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		var top int64
		for {
			select {
			case <-ctx.Done():
				if top > 0 {
					b.prog.logf("heap profile at %s RSS written to %s", mib(top), filepath.Join(b.cfg.ProfileDir, name+".heap.pprof"))
				}
				return
			case <-t.C:
			}
			st, err := svc.stats()
			if err != nil || st.rss <= top+top/50 {
				continue
			}
			top = st.rss
			for _, p := range []struct{ query, file string }{{"heap", ".heap.pprof"}, {"heap?debug=1", ".heap.txt"}} {
				if err := fetchProfile(ctx, svc.pprofAddr, p.query, filepath.Join(b.cfg.ProfileDir, name+p.file)); err != nil && ctx.Err() == nil {
					b.prog.logf("heap profile %s: %v", name, err)
				}
			}
		}
	}()
	return func() { cancel(); <-done }
}

// fetchProfile saves GET /debug/pprof/<query> of the pprof server at
// addr to path.
func fetchProfile(ctx context.Context, addr, query, path string) error {
	url := "http://" + addr + "/debug/pprof/" + query
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// sanitize turns a run name into a file name.
func sanitize(name string) string {
	out := []byte(name)
	for i, c := range out {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
			out[i] = '-'
		}
	}
	return string(out)
}
