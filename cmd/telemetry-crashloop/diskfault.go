package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/cmd/internal/exactlyonce"
)

// Disk faults (-disk-faults N). The service's data dir (its day tables
// and the embedded JetStream store) is a tmpfs of -disk-size (300 MB by
// default; the service starts with its default flags and fits its sizes
// to it). While the loop publishes, N times:
//
//   - a filler file grows at -fill-rate until the file system refuses
//     more (no space left on device); /readyz must turn 503 while it is
//     full (counted when it does not within 5 s);
//   - after -full-for, the filler is removed; the time until the next
//     publish is acked is measured.
//
// Before the first fault, a cold day (four days back) gets numbered
// readings of its own device (cold-0) and, its table closed (the
// service runs with -max-open-tables 1 and a second cold day is written
// after it), three bytes are flipped in the middle of its largest table
// file, as a failing disk would. Then more readings of that day are
// published: they are acked (the stream holds them) while the table
// refuses to open. The loop acts as the operator: it waits for the
// service's log to name the damaged day and the repair request, and
// sends it (POST /v1/tables/<day>/repair), as the log says.
//
// The service is never restarted. The result counts, besides the loop's
// readings, the cold day's readings lost or duplicated, the faults, how
// long publishes took to be acked again after each freeing (the
// longest), and the times /readyz said 200 while the disk was full.

// DiskFaultCounts is what the disk faults did.
type DiskFaultCounts struct {
	Fills          int           // times the disk was filled and freed
	ReadyWhileFull int           // fills during which /readyz never turned 503
	MaxRecovery    time.Duration // longest time from freeing to the next acked publish
	Recoveries     []time.Duration
	ColdAcked      int           // readings of the damaged day acked
	ColdLost       int           // of them, not stored after the repair
	ColdDuplicated int           // stored more than once
	Repaired       bool          // the repair request succeeded
	RepairAfter    time.Duration // from the flip to the repair answer
	Restarts       int           // always 0: the service is never restarted
}

func (c *DiskFaultCounts) String() string {
	rs := make([]string, len(c.Recoveries))
	for i, r := range c.Recoveries {
		rs[i] = r.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("fills=%d ready_while_full=%d max_recovery=%s recoveries=[%s] cold_acked=%d cold_lost=%d cold_duplicated=%d repaired=%t repair_after=%s restarts=%d",
		c.Fills, c.ReadyWhileFull, c.MaxRecovery.Round(time.Millisecond), strings.Join(rs, " "), c.ColdAcked, c.ColdLost,
		c.ColdDuplicated, c.Repaired, c.RepairAfter.Round(time.Millisecond), c.Restarts)
}

// OK reports whether nothing acked was lost or duplicated, /readyz
// told the truth and the repair succeeded.
func (c *DiskFaultCounts) OK() bool {
	return c.ColdLost == 0 && c.ColdDuplicated == 0 && c.ReadyWhileFull == 0 && c.Repaired && c.Restarts == 0
}

// mountDisk mounts a tmpfs of size bytes at dir.
func mountDisk(dir string, size int64) (unmount func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d", size), "tmpfs", dir).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("-disk-faults: mount a tmpfs (needs root): %v: %s", err, out)
	}
	return func() { _ = exec.Command("umount", "-l", dir).Run() }, nil
}

// diskFaultDisk mounts the tmpfs of -disk-faults under work and puts
// the data dir on it.
func diskFaultDisk(cfg *Config, work string) (unmount func(), err error) {
	if cfg.PowerCut || cfg.Hostile || cfg.Backup || cfg.Protocol != "nats" && cfg.Protocol != "" {
		return nil, errors.New("-disk-faults: only with -protocol nats, without -power-cut, -hostile or -backup")
	}
	disk := filepath.Join(work, "disk")
	if unmount, err = mountDisk(disk, cfg.DiskSize); err != nil {
		return nil, err
	}
	cfg.DataDir = filepath.Join(disk, "data")
	cfg.Args = append(cfg.Args, "-max-open-tables", "1")
	return unmount, nil
}

// coldDevice publishes the readings of the damaged day.
const coldDevice = "cold-0"

// diskFaults runs the faults of -disk-faults while pub publishes.
type diskFaults struct {
	cfg    Config
	svc    *service
	pub    *publisher
	js     jetstream.JetStream
	disk   string // the tmpfs
	log    *slog.Logger
	counts *DiskFaultCounts

	coldBase  time.Time // cold reading n is at coldBase + n seconds
	coldAcked []int
}

// run flips the cold table, then fills and frees the disk cfg.DiskFaults
// times, repairing the table when the service's log asks for it.
func (d *diskFaults) run(ctx context.Context) error {
	rng := rand.New(rand.NewPCG(uint64(d.cfg.Seed), 0xd15c))
	day := time.Now().UTC().Truncate(24*time.Hour).AddDate(0, 0, -4)
	d.coldBase = day.Add(time.Hour)
	if err := d.publishCold(ctx, 0, 500); err != nil {
		return err
	}
	if err := d.publishOther(ctx, day.AddDate(0, 0, -1)); err != nil {
		return err
	}
	flipped := time.Now()
	if err := d.flip(ctx, day); err != nil {
		return err
	}
	if err := d.publishCold(ctx, 500, 500); err != nil {
		return err
	}
	repaired := make(chan error, 1)
	go func() { repaired <- d.repairWhenAsked(ctx, day.Format("2006-01-02"), flipped) }()
	for d.counts.Fills < d.cfg.DiskFaults {
		up := 2*time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		select {
		case <-time.After(up):
		case <-ctx.Done():
			return ctx.Err()
		}
		if err := d.fillAndFree(ctx); err != nil {
			return fmt.Errorf("fault %d: %w", d.counts.Fills+1, err)
		}
		d.counts.Fills++
	}
	return <-repaired
}

// publishCold publishes cold readings first..first+n-1, one a message,
// each waiting for its ack (retrying while the stream refuses).
func (d *diskFaults) publishCold(ctx context.Context, first, n int) error {
	for i := first; i < first+n; i++ {
		at := d.coldBase.Add(time.Duration(i) * time.Second)
		data := fmt.Appendf(nil, `{"ts":%d,"seq":%d}`, at.UnixMilli(), i)
		for {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			_, err := d.js.Publish(pctx, "telemetry."+coldDevice, data)
			cancel()
			if err == nil {
				d.coldAcked = append(d.coldAcked, i)
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nil
}

// publishOther writes one reading of another cold day and waits until
// the cold day's readings are stored, so that with -max-open-tables 1
// the cold day's table is closed.
func (d *diskFaults) publishOther(ctx context.Context, day time.Time) error {
	if _, err := d.js.Publish(ctx, "telemetry.cold-1", fmt.Appendf(nil, `{"ts":%d,"v":1}`, day.Add(time.Hour).UnixMilli())); err != nil {
		return err
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		got, err := exactlyonce.ReadDevice(ctx, nil, "http://"+d.svc.httpAddr, "cold-1", day, day.Add(24*time.Hour), nil)
		if err == nil && len(got) == 1 {
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("the second cold day's reading was never stored")
}

// flip flips three bytes in the middle of the largest table file of the
// cold day, once its table is closed (no memtable log left).
func (d *diskFaults) flip(ctx context.Context, day time.Time) error {
	dir := filepath.Join(d.cfg.DataDir, "tables", day.Format("2006-01-02"))
	deadline := time.Now().Add(time.Minute)
	for {
		mems, _ := filepath.Glob(filepath.Join(dir, "*.mem"))
		ssts, _ := filepath.Glob(filepath.Join(dir, "*.sst"))
		if len(mems) == 0 && len(ssts) > 0 {
			slices.SortFunc(ssts, func(a, b string) int { return int(fileSize(b) - fileSize(a)) })
			b, err := os.ReadFile(ssts[0])
			if err != nil {
				return err
			}
			for i := range 3 {
				b[len(b)/2+i*7] ^= 0x5a
			}
			d.log.Info("disk faults: flipped three bytes", "file", ssts[0])
			return os.WriteFile(ssts[0], b, 0o600)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the cold day's table %s was not closed within a minute", dir)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// repairWhenAsked waits for the service's log to ask for the repair of
// day, then sends the request the log names.
func (d *diskFaults) repairWhenAsked(ctx context.Context, day string, flipped time.Time) error {
	want := "POST /v1/tables/" + day + "/repair"
	for {
		b, _ := os.ReadFile(d.svc.logPath)
		if strings.Contains(string(b), want) {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	d.log.Info("disk faults: the log asks for a repair; sending it", "request", want)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+d.svc.httpAddr+"/v1/tables/"+day+"/repair", nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				d.counts.Repaired, d.counts.RepairAfter = true, time.Since(flipped)
				return nil
			}
			d.log.Warn("disk faults: repair refused; trying again", "status", resp.StatusCode)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// fillAndFree fills the tmpfs at cfg.FillRate until it is full, checks
// /readyz, waits cfg.FullFor and frees it, then measures how long the
// next publish takes to be acked.
func (d *diskFaults) fillAndFree(ctx context.Context) error {
	path := filepath.Join(d.disk, "filler")
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	chunk := make([]byte, 1<<20)
	tick := time.Duration(float64(time.Second) * float64(len(chunk)) / float64(d.cfg.FillRate))
	for {
		if _, err := f.Write(chunk); err != nil {
			break
		}
		time.Sleep(tick)
	}
	for n := 64 << 10; n >= 512; n /= 2 {
		for {
			if _, err := f.Write(chunk[:n]); err != nil {
				break
			}
		}
	}
	_ = f.Close()
	notReady := false
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if code := readyz(d.svc.httpAddr); code == http.StatusServiceUnavailable {
			notReady = true
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !notReady {
		d.counts.ReadyWhileFull++
	}
	time.Sleep(d.cfg.FullFor)
	if err := os.Remove(path); err != nil {
		return err
	}
	freed, before := time.Now(), d.pub.acked.Load()
	for d.pub.acked.Load() == before && d.pub.next.Load() < int64(d.pub.messages()) {
		if time.Since(freed) > 2*time.Minute {
			return errors.New("no publish acked within 2 minutes of freeing the disk")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	took := time.Since(freed)
	d.counts.Recoveries = append(d.counts.Recoveries, took)
	d.counts.MaxRecovery = max(d.counts.MaxRecovery, took)
	var st syscall.Statfs_t
	_ = syscall.Statfs(d.disk, &st)
	d.log.Info("disk faults: disk filled and freed", "fault", d.counts.Fills+1, "ready_503_while_full", notReady,
		"acked_again_after", took.Round(time.Millisecond), "free_mib", int64(st.Bavail)*int64(st.Bsize)>>20)
	return nil
}

// readyz is the status of the service's /readyz (0 when it does not
// answer).
func readyz(addr string) int {
	c := http.Client{Timeout: time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// checkCold counts the cold day's acked readings lost or duplicated.
func (d *diskFaults) checkCold(ctx context.Context) error {
	from, to := d.coldBase.Add(-time.Second), d.coldBase.Add(1001*time.Second)
	got, err := exactlyonce.ReadDevice(ctx, nil, "http://"+d.svc.httpAddr, coldDevice, from, to, nil)
	if err != nil {
		return err
	}
	run := exactlyonce.Run{Field: "seq", Base: d.coldBase, Step: time.Second}
	t := run.Check(d.coldAcked, got)
	d.counts.ColdAcked, d.counts.ColdLost, d.counts.ColdDuplicated = len(d.coldAcked), t.Lost, t.Duplicated
	return nil
}
