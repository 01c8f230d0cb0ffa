package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// The device filter measurement (-match-devices N): a fresh telemetryd
// is sent N devices, one reading each, and given their attributes with
// PUT /v1/devices/{device}/attributes, spread over 10 fleets (and 7
// models); then the
// device list filtered by one fleet, GET /v1/devices?match={fleet="East"},
// is timed one request at a time: its first page at the default limit
// and at limit=1000, each alternating with the unfiltered first page as
// the baseline of the same moment. Then every page of the filtered list
// is walked once to check that it holds exactly the fleet's devices.

// matchFleets are the fleets of the device filter measurement.
var matchFleets = []string{"East", "West", "North", "South", "Central", "Coast", "Valley", "Mountain", "Harbor", "Airport"}

// matchModels are the models it spreads the devices over.
var matchModels = []string{"F-150", "G-2000", "H-2", "J-3", "K-40", "L-5", "M-6"}

// matchMessages is one JSON message per device.
type matchMessages struct {
	n  int
	at time.Time
}

func (m matchMessages) count() int               { return m.n }
func (m matchMessages) readingsBefore(i int) int { return i }
func (m matchMessages) natsMsg(i int) *nats.Msg {
	dev := matchDevice(i)
	payload := fmt.Sprintf(`{"ts":%d,"load":%d}`, m.at.UnixMilli(), i%1000)
	return &nats.Msg{Subject: "telemetry." + dev, Data: []byte(payload)}
}

// matchDevice is the ID of device i.
func matchDevice(i int) string { return fmt.Sprintf("dev-%06d", i) }

// runMatchDevices runs the device filter measurement and prints its
// report to stdout.
func runMatchDevices(ctx context.Context, cfg Config, stdout, progressOut io.Writer) error {
	work, err := os.MkdirTemp(cfg.WorkDir, "telemetry-match-")
	if err != nil {
		return err
	}
	defer removeAll(work, cfg.Keep)
	b := &bench{cfg: cfg, prog: newProgress(progressOut, cfg.Progress), work: work, bin: cfg.Binary}
	if err := b.ensureBinary(ctx); err != nil {
		return err
	}
	svc := &service{bin: b.bin, dataDir: filepath.Join(work, "data"), logPath: filepath.Join(work, "telemetryd.log"),
		telemetry: true, args: []string{"-http-rate", "0"}}
	if err := svc.start(ctx); err != nil {
		return err
	}
	defer svc.stop(time.Minute)
	nc, err := nats.Connect(svc.natsURL())
	if err != nil {
		return err
	}
	n := cfg.MatchDevices
	ph := b.prog.begin(fmt.Sprintf("publish %d devices with attributes", n), n, "readings")
	msgs := matchMessages{n: n, at: time.Now().Add(-time.Minute)}
	if _, err := publishAll(ctx, nc, msgs, nil); err != nil {
		nc.Close()
		return err
	}
	nc.Close()
	if err := waitStored(ctx, svc, int64(n), ph, 100*time.Millisecond); err != nil {
		return err
	}
	ph.end("")
	ph = b.prog.begin("PUT every device's attributes", n, "devices")
	start := time.Now()
	if err := putAttributes(ctx, svc, n, ph); err != nil {
		return err
	}
	putRate := float64(n) / time.Since(start).Seconds()
	ph.end(fmt.Sprintf("%s devices/s", num(putRate)))
	ph = b.prog.begin("wait for the service to go idle", 0, "")
	if _, err := waitIdle(ctx, svc, 0.05, 3*time.Minute); err != nil {
		return err
	}
	ph.end("")
	const fleet = "East"
	match := url.QueryEscape(fmt.Sprintf("{fleet=%q}", fleet))
	want := 0
	for i := range n {
		if matchFleets[i%len(matchFleets)] == fleet {
			want++
		}
	}
	got, err := walkDevices(ctx, svc, "/v1/devices?limit=1000&match="+match, fleet)
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("match={fleet=%q} listed %d devices, want %d", fleet, got, want)
	}
	type figure struct {
		name     string
		filtered string
		all      string
	}
	figures := []figure{
		{"first page, default limit (100)", "/v1/devices?match=" + match, "/v1/devices"},
		{"first page, limit=1000", "/v1/devices?limit=1000&match=" + match, "/v1/devices?limit=1000"},
	}
	s := section{title: fmt.Sprintf(`GET /v1/devices?match={fleet="%s"} over %s devices in %d fleets (%s match), %d requests each, one at a time`,
		fleet, num(float64(n)), len(matchFleets), num(float64(want)), cfg.Queries),
		header: []string{"request", "filtered p50 / p99", "unfiltered p50 / p99 (same run, alternating)", "filtered p99 / unfiltered p99", "filtered p99 <= 5 ms"}}
	q := &querier{svc: svc}
	for _, f := range figures {
		ph := b.prog.begin("time "+f.name, 2*cfg.Queries, "requests")
		var filtered, all []time.Duration
		for i := range cfg.Queries {
			for j, path := range []string{f.filtered, f.all} {
				if i%2 == 1 {
					path = []string{f.all, f.filtered}[j]
				}
				start := time.Now()
				if _, err := q.get(ctx, path, false); err != nil {
					return err
				}
				d := time.Since(start)
				if path == f.filtered {
					filtered = append(filtered, d)
				} else {
					all = append(all, d)
				}
				ph.add(1)
			}
		}
		fl, al := summarize(filtered), summarize(all)
		ph.end(fmt.Sprintf("p99 %s against %s", ms(fl.P99), ms(al.P99)))
		s.rows = append(s.rows, []string{f.name, ms(fl.P50) + " / " + ms(fl.P99), ms(al.P50) + " / " + ms(al.P99),
			ratio(float64(fl.P99), float64(al.P99)), met(fl.P99 <= 5*time.Millisecond)})
	}
	s.notes = append(s.notes, fmt.Sprintf("Walking every page of the filtered list (limit=1000) found exactly the %s devices of the fleet. The attributes were set at %s PUTs/s (%d in flight). Load at the end: %s.",
		num(float64(want)), num(putRate), matchPutWriters, loadavg()))
	fmt.Fprint(stdout, report{sections: []section{s}}.text())
	return nil
}

// walkDevices follows the pages of path and counts the devices, each of
// which must have the attribute fleet.
func walkDevices(ctx context.Context, svc *service, path, fleet string) (int, error) {
	n := 0
	next := ""
	for {
		var page struct {
			Devices []struct {
				Device     string            `json:"device"`
				Attributes map[string]string `json:"attributes"`
			} `json:"devices"`
			Next string `json:"next"`
		}
		p := path
		if next != "" {
			p += "&cursor=" + url.QueryEscape(next)
		}
		if err := svc.getJSON(ctx, p, &page); err != nil {
			return n, err
		}
		for _, d := range page.Devices {
			if d.Attributes["fleet"] != fleet {
				return n, fmt.Errorf("%s listed %s of fleet %q", path, d.Device, d.Attributes["fleet"])
			}
		}
		n += len(page.Devices)
		if page.Next == "" {
			return n, nil
		}
		next = page.Next
		if n > 10_000_000 {
			return n, fmt.Errorf("%s: more than %s devices", path, strconv.Itoa(n))
		}
	}
}

// matchPutWriters is how many attribute PUTs are in flight.
const matchPutWriters = 4

// putAttributes gives devices [0, n) their fleet and model with PUT
// /v1/devices/{device}/attributes.
func putAttributes(ctx context.Context, svc *service, n int, ph *phase) error {
	var next atomic.Int64
	errs := make([]error, matchPutWriters)
	var wg sync.WaitGroup
	for w := range matchPutWriters {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				body := fmt.Sprintf(`{"fleet":%q,"model":%q}`, matchFleets[i%len(matchFleets)], matchModels[i%len(matchModels)])
				req, err := http.NewRequestWithContext(ctx, http.MethodPut, svc.url("/v1/devices/"+matchDevice(i)+"/attributes"), bytes.NewReader([]byte(body)))
				if err != nil {
					errs[w] = err
					return
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := svc.client.Do(req)
				if err != nil {
					errs[w] = err
					return
				}
				msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errs[w] = fmt.Errorf("PUT attributes of %s: %s: %s", matchDevice(i), resp.Status, msg)
					next.Store(int64(n))
					return
				}
				ph.add(1)
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return ctx.Err()
}
