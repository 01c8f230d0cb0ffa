package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	mqtt "github.com/eclipse/paho.mqtt.golang"
	"github.com/nats-io/nats.go"
)

// The "connect" phase compares the device-facing doors of the service,
// each end to end on a fresh service, interleaved and repeated:
//
//   - JSON over JetStream at 100 readings per message (the baseline of
//     line protocol) and InfluxDB line protocol over HTTP: the same
//     readings, 5,000 lines (50 such messages, 50 devices) per POST
//     /api/v2/write, 2 writers;
//   - JSON over JetStream at 1 reading per message (the baseline of
//     MQTT) and MQTT QoS 1 at 1 reading per message, acked on PUBACK:
//     published by mqttPublisher (door mqtt) or by paho's client (door
//     mqtt-paho, the same packets at more CPU in the load generator);
//   - with -sync-writes (doors line-sync and mqtt-sync, measured only when
//     -doors names them): line protocol and MQTT QoS 1 against the same
//     door without it. Line protocol also in writes of 1,000 devices
//     (5 lines each: one atomic batch of 1,000 messages with
//     -sync-writes) besides 50 (100 lines each, the usual shape). The
//     MQTT run publishes 1/syncShare of the readings, as the end-to-end
//     -sync-writes runs do.
const (
	connectLinesPerRequest = 5000
	connectLineWriters     = 2
	connectMQTTClients     = 4
	connectMQTTWindow      = 512 // QoS 1 publishes in flight per MQTT connection
)

// connectRun is one door measured.
type connectRun struct {
	Door     string // what -doors names it: line, mqtt, mqtt-paho (a door) or its baseline
	Name     string
	Base     string // the Name of the baseline a door is measured against; empty for a baseline
	Protocol string // nats, line, mqtt or mqtt-paho
	PerMsg   int    // readings per JSON message (the workload's grouping)
	Sync     bool   // the service runs with -sync-writes
}

// connectResult is what one connect run measured.
type connectResult struct {
	Run         connectRun
	Readings    int
	PublishRate float64       // readings/s from the first send to the last ack (204, PUBACK)
	Rate        float64       // readings/s from the first send until stored
	ServiceCPU  time.Duration // service CPU over the run
	ClientCPU   time.Duration // the load generator's own CPU over the run
}

func connectRuns() []connectRun {
	return []connectRun{
		{Door: "line", Name: "JSON over JetStream, 100/msg", Protocol: "nats", PerMsg: 100},
		{Door: "line", Name: "line protocol, 5000 lines/request, 2 writers", Base: "JSON over JetStream, 100/msg", Protocol: "line", PerMsg: 100},
		{Door: "mqtt", Name: "JSON over JetStream, 1/msg", Protocol: "nats", PerMsg: 1},
		{Door: "mqtt", Name: "MQTT QoS 1, 1/msg", Base: "JSON over JetStream, 1/msg", Protocol: "mqtt", PerMsg: 1},
		{Door: "mqtt-paho", Name: "MQTT QoS 1, 1/msg, paho client", Base: "JSON over JetStream, 1/msg", Protocol: "mqtt-paho", PerMsg: 1},
		{Door: "line-sync", Name: "line protocol, 5000 lines/request, 2 writers, sync-writes", Base: "line protocol, 5000 lines/request, 2 writers",
			Protocol: "line", PerMsg: 100, Sync: true},
		{Door: "line-sync", Name: "line protocol, 5000 lines/request of 1000 devices, 2 writers", Protocol: "line", PerMsg: 5},
		{Door: "line-sync", Name: "line protocol, 5000 lines/request of 1000 devices, 2 writers, sync-writes",
			Base: "line protocol, 5000 lines/request of 1000 devices, 2 writers", Protocol: "line", PerMsg: 5, Sync: true},
		{Door: "mqtt-sync", Name: "MQTT QoS 1, 1/msg, sync-writes", Base: "MQTT QoS 1, 1/msg", Protocol: "mqtt", PerMsg: 1, Sync: true},
	}
}

// wanted tells whether run is one of doors or the baseline of one of
// them (every run but those of the -sync doors when doors is empty).
func wanted(run connectRun, doors []string) bool {
	if len(doors) == 0 {
		return !strings.HasSuffix(run.Door, "-sync")
	}
	return slices.Contains(doors, run.Door) || slices.ContainsFunc(connectRuns(), func(r connectRun) bool {
		return r.Base == run.Name && slices.Contains(doors, r.Door)
	})
}

// runConnect runs every connect configuration Config.Repeat times,
// interleaved so that a noisy moment of the machine hits all of them.
func (b *bench) runConnect(ctx context.Context) error {
	if err := b.ensureBinary(ctx); err != nil {
		return err
	}
	for rep := range max(b.cfg.Repeat, 1) {
		runs := connectRuns()
		if rep%2 == 1 {
			// Every other round in reverse (A B B A): what the machine
			// carries from one run into the next (dirty pages of the
			// data just deleted, a build starting) falls on the door
			// and on its baseline alike.
			slices.Reverse(runs)
		}
		for _, run := range runs {
			if !wanted(run, b.cfg.Doors) {
				continue
			}
			r, err := b.connectOnce(ctx, run, rep)
			removeAll(filepath.Join(b.work, "connect"), b.cfg.Keep)
			if err != nil {
				return fmt.Errorf("%s: %w", run.Name, err)
			}
			b.res.Connect = append(b.res.Connect, r)
		}
	}
	return nil
}

// connectOnce measures run once; with -profile-dir it saves a CPU
// profile of the service as connect-<run>-<rep>.pprof.
func (b *bench) connectOnce(ctx context.Context, run connectRun, rep int) (connectResult, error) {
	dir := filepath.Join(b.work, "connect")
	err := os.MkdirAll(dir, 0o755)
	if err != nil {
		return connectResult{}, err
	}
	svc := &service{bin: b.bin, dataDir: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "telemetryd.log"), telemetry: true}
	if run.Sync {
		svc.args = append(svc.args, "-sync-writes")
	}
	if b.cfg.ProfileDir != "" {
		if svc.pprofAddr, err = freeAddr(); err != nil {
			return connectResult{}, err
		}
	}
	if err := svc.start(ctx); err != nil {
		return connectResult{}, err
	}
	defer svc.stop(30 * time.Second)
	w := b.ingestWorkload(run.PerMsg)
	if run.Sync && run.Protocol != "line" {
		// One fsync per message: the run publishes a share of the readings.
		w = newWorkload(b.devices, max(b.cfg.Readings/syncShare, len(b.devices)*run.PerMsg), run.PerMsg, time.Second, time.Now().Add(-time.Minute))
	}
	res := connectResult{Run: run, Readings: w.readings()}
	ph := b.prog.begin("connect: "+run.Name+" (stored)", w.readings(), "readings")
	defer ph.end("")
	before, err := svc.stats()
	if err != nil {
		return res, err
	}
	profName := fmt.Sprintf("connect-%s-%d", sanitize(run.Name), rep+1)
	stopProfile := b.profile(ctx, svc, profName)
	defer stopProfile()
	stopClientProfile := b.profileSelf(profName + "-client.pprof")
	defer stopClientProfile()
	clientBefore := selfCPU()
	start := time.Now()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	waited := make(chan error, 1)
	go func() { waited <- waitStored(wctx, svc, int64(w.readings()), ph, 50*time.Millisecond) }()
	var sent time.Duration
	switch run.Protocol {
	case "nats":
		var nc *nats.Conn
		if nc, err = nats.Connect(svc.natsURL()); err == nil {
			var st pubStats
			st, err = publishAll(ctx, nc, w, nil)
			sent = st.elapsed
			nc.Close()
		}
	case "line":
		sent, err = postLines(ctx, "http://"+svc.httpAddr, w)
	case "mqtt":
		sent, err = publishMQTT(ctx, svc.mqttAddr, w)
	case "mqtt-paho":
		sent, err = publishMQTTPaho(ctx, svc.mqttAddr, w)
	}
	if err != nil {
		cancel()
		<-waited
		return res, err
	}
	if err := <-waited; err != nil {
		return res, err
	}
	elapsed := time.Since(start)
	res.ClientCPU = selfCPU() - clientBefore
	after, err := svc.stats()
	if err != nil {
		return res, err
	}
	res.PublishRate = float64(res.Readings) / sent.Seconds()
	res.Rate = float64(res.Readings) / elapsed.Seconds()
	res.ServiceCPU = after.cpu - before.cpu
	ph.end(fmt.Sprintf("%.0f readings/s end to end (accepted at %.0f/s); CPU s per M readings: service %.1f, load generator %.1f",
		res.Rate, res.PublishRate, cpuPerMillion(res.ServiceCPU, res.Readings), cpuPerMillion(res.ClientCPU, res.Readings)))
	return res, nil
}

// profileSelf saves a CPU profile of the load generator itself (the
// first -profile-seconds of the run, or less if it ends sooner) to
// name in -profile-dir, and returns the function that ends it early.
func (b *bench) profileSelf(name string) func() {
	if b.cfg.ProfileDir == "" {
		return func() {}
	}
	path := filepath.Join(b.cfg.ProfileDir, name)
	f, err := os.Create(path)
	if err == nil {
		if err = pprof.StartCPUProfile(f); err != nil {
			f.Close()
		}
	}
	if err != nil {
		b.prog.logf("profile %s: %v", name, err)
		return func() {}
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil {
				b.prog.logf("profile %s: %v", name, err)
				return
			}
			b.prog.logf("profile written to %s", path)
		})
	}
	t := time.AfterFunc(time.Duration(b.cfg.ProfileSeconds)*time.Second, stop)
	return func() { t.Stop(); stop() }
}

// appendLine appends reading i of message m of w as line protocol.
func (w workload) appendLine(dst []byte, m, i int) []byte {
	temp, hum, ok := w.sample(m, i)
	dst = append(dst, "env,device="...)
	dst = append(dst, w.device(m)...)
	dst = append(dst, " temp="...)
	dst = strconv.AppendFloat(dst, temp, 'f', 2, 64)
	dst = append(dst, ",hum="...)
	dst = strconv.AppendInt(dst, hum, 10)
	dst = append(dst, "i,ok="...)
	dst = strconv.AppendBool(dst, ok)
	dst = append(dst, ' ')
	dst = strconv.AppendInt(dst, w.at(m, i).UnixNano(), 10)
	return append(dst, '\n')
}

// postLines posts w as line protocol, connectLinesPerRequest lines per
// request (consecutive messages, so many devices per request), with
// connectLineWriters requests in flight. Each writer builds its next
// body while its current one is in flight, as the JSON publisher
// builds its next message while earlier ones await their acks (both
// build during the measured time). It returns the time from the first
// request to the last 204.
func postLines(ctx context.Context, base string, w workload) (time.Duration, error) {
	perReq := max(connectLinesPerRequest/w.perMsg, 1)
	requests := (w.msgs + perReq - 1) / perReq
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: connectLineWriters}}
	url := base + "/api/v2/write?bucket=bench&precision=ns"
	var next atomic.Int64
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	type request struct {
		n    int
		body []byte
	}
	start := time.Now()
	for range connectLineWriters {
		wg.Go(func() {
			free := make(chan []byte, 2) // the body in flight and the next
			for range cap(free) {
				free <- make([]byte, 0, 64*connectLinesPerRequest)
			}
			ready := make(chan request, 1)
			stop := make(chan struct{})
			defer close(stop)
			go func() {
				defer close(ready)
				for {
					r := int(next.Add(1)) - 1
					if r >= requests || ctx.Err() != nil {
						return
					}
					var buf []byte
					select {
					case buf = <-free:
					case <-stop:
						return
					}
					buf = buf[:0]
					for m := r * perReq; m < min((r+1)*perReq, w.msgs); m++ {
						for i := range w.perMsg {
							buf = w.appendLine(buf, m, i)
						}
					}
					select {
					case ready <- request{r, buf}:
					case <-stop:
						return
					}
				}
			}()
			for req := range ready {
				if err := postOnce(ctx, client, url, req.body); err != nil {
					once.Do(func() { firstErr = fmt.Errorf("request %d: %w", req.n, err) })
					return
				}
				free <- req.body
			}
		})
	}
	wg.Wait()
	return time.Since(start), firstErr
}

func postOnce(ctx context.Context, client *http.Client, url string, body []byte) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("%s: %s", resp.Status, msg)
	}
	return nil
}

// publishMQTT publishes every message of w with QoS 1 on
// telemetry/<device> over connectMQTTClients connections (a device
// always on the same one), at most connectMQTTWindow unacknowledged per
// connection, and returns the time from the first publish to the last
// PUBACK.
func publishMQTT(ctx context.Context, addr string, w workload) (time.Duration, error) {
	topics := make([]string, len(w.devices))
	for i, d := range w.devices {
		topics[i] = "telemetry/" + string(d)
	}
	pubs := make([]*mqttPublisher, connectMQTTClients)
	for i := range pubs {
		p, err := dialMQTTPublisher(ctx, addr, fmt.Sprintf("bench-%d", i), connectMQTTWindow)
		if err != nil {
			for _, p := range pubs[:i] {
				_ = p.close()
			}
			return 0, err
		}
		pubs[i] = p
	}
	errs := make([]error, len(pubs))
	var wg sync.WaitGroup
	start := time.Now()
	for ci, p := range pubs {
		wg.Go(func() {
			buf := make([]byte, 0, 128)
			for m := 0; m < w.msgs && errs[ci] == nil; m++ {
				if dev := m % len(w.devices); dev%len(pubs) == ci {
					if m%1024 == 0 && ctx.Err() != nil {
						break
					}
					buf = w.payload(buf[:0], m)
					errs[ci] = p.publish(topics[dev], buf)
				}
			}
			if err := p.close(); errs[ci] == nil {
				errs[ci] = err
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return time.Since(start), ctx.Err()
}

// publishMQTTPaho is publishMQTT with paho's client. Its connections
// coalesce paho's small writes and buffer its reads (bufferedMQTTConn),
// as a device's TCP stack would.
func publishMQTTPaho(ctx context.Context, addr string, w workload) (time.Duration, error) {
	clients := make([]mqtt.Client, connectMQTTClients)
	for i := range clients {
		c := mqtt.NewClient(mqtt.NewClientOptions().AddBroker("tcp://" + addr).
			SetClientID(fmt.Sprintf("bench-%d", i)).SetProtocolVersion(4).SetCleanSession(true).
			SetAutoReconnect(false).SetCustomOpenConnectionFn(bufferedMQTTConn))
		if tok := c.Connect(); !tok.WaitTimeout(30*time.Second) || tok.Error() != nil {
			return 0, fmt.Errorf("mqtt connect %s: %v", addr, tok.Error())
		}
		defer c.Disconnect(250)
		clients[i] = c
	}
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for ci, c := range clients {
		wg.Go(func() {
			window := make(chan mqtt.Token, connectMQTTWindow)
			settle := func(tok mqtt.Token) {
				select { // the oldest is mostly acked already: no timer then
				case <-tok.Done():
				default:
					if !tok.WaitTimeout(time.Minute) {
						err := fmt.Errorf("no PUBACK within a minute")
						failed.CompareAndSwap(nil, &err)
						return
					}
				}
				if err := tok.Error(); err != nil {
					failed.CompareAndSwap(nil, &err)
				}
			}
			buf := make([]byte, 0, 128)
			for m := 0; m < w.msgs; m++ {
				if (m%len(w.devices))%len(clients) != ci {
					continue
				}
				if ctx.Err() != nil || failed.Load() != nil {
					break
				}
				if len(window) == cap(window) {
					settle(<-window)
				}
				buf = w.payload(buf[:0], m)
				// paho keeps the payload until the packet is written, so each
				// publish gets its own copy.
				window <- c.Publish("telemetry/"+string(w.device(m)), 1, false, bytes.Clone(buf))
			}
			close(window)
			for tok := range window {
				settle(tok)
			}
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, *err
	}
	return time.Since(start), ctx.Err()
}

// connectSection is the report table of the connect phase: the median
// of each run, and each door against its JetStream baseline.
func connectSection(r *Results) section {
	med := func(name string) *connectResult {
		var rs []*connectResult
		for i := range r.Connect {
			if r.Connect[i].Run.Name == name {
				rs = append(rs, &r.Connect[i])
			}
		}
		if len(rs) == 0 {
			return nil
		}
		slices.SortFunc(rs, func(a, b *connectResult) int { return cmp.Compare(a.Rate, b.Rate) })
		return rs[len(rs)/2]
	}
	s := section{title: "Device doors, end to end (median of the interleaved runs)",
		header: []string{"path", "readings", "accepted readings/s", "stored readings/s", "service CPU s/M readings", "load generator CPU s/M readings", "vs baseline (stored)", "vs baseline (accepted)", "all runs stored/s"}}
	runs := connectRuns()
	for _, run := range runs {
		c := med(run.Name)
		if c == nil {
			continue
		}
		vsStored, vsAcc := "baseline", "baseline"
		if run.Base != "" {
			if base := med(run.Base); base != nil {
				vsStored, vsAcc = ratio(c.Rate, base.Rate), ratio(c.PublishRate, base.PublishRate)
			}
		}
		var all string
		for _, x := range r.Connect {
			if x.Run.Name == run.Name {
				if all != "" {
					all += ", "
				}
				all += num(x.Rate)
			}
		}
		s.rows = append(s.rows, []string{run.Name, num(float64(c.Readings)), num(c.PublishRate), num(c.Rate),
			strconv.FormatFloat(cpuPerMillion(c.ServiceCPU, c.Readings), 'f', 1, 64),
			strconv.FormatFloat(cpuPerMillion(c.ClientCPU, c.Readings), 'f', 1, 64), vsStored, vsAcc, all})
	}
	s.notes = append(s.notes, "targets: line protocol >= 0.8x JSON over JetStream at 100/msg; MQTT QoS 1 >= 0.7x JSON over JetStream at 1/msg (stored readings/s); a -sync-writes door is against the same door without it")
	return s
}
