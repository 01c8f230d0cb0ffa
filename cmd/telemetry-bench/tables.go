package main

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"time"
)

// buildReport turns results into the report's tables.
func buildReport(r *Results) report {
	m := r.Machine
	rep := report{head: []string{
		fmt.Sprintf("telemetry-bench, %s, took %s", r.Started.UTC().Format(time.RFC3339), r.Elapsed.Round(time.Second)),
		fmt.Sprintf("machine: %d CPUs (%s), %s memory, %s, %s; load average %s at the start, %s at the end",
			m.CPUs, m.CPUModel, m.Memory, m.Kernel, m.GoVersion, m.LoadStart, r.LoadEnd),
		fmt.Sprintf("sizes: %s readings per ingest measurement over %d devices, 3 values per reading; %s query readings; %d requests per latency figure",
			num(float64(r.Config.Readings)), r.Config.Devices, num(float64(r.Config.QueryReadings)), r.Config.Queries),
	}}
	rep.sections = append(rep.sections, ingestSection(r), e2eSection(r))
	if r.Query != nil {
		rep.sections = append(rep.sections, querySection(r.Query), diskSection(r))
	}
	if len(r.Connect) > 0 {
		rep.sections = append(rep.sections, connectSection(r))
	}
	if len(r.TSBS) > 0 {
		rep.sections = append(rep.sections, tsbsSection(r))
	}
	rep.sections = append(rep.sections, targetSection(r))
	// Parts that did not run leave their tables empty.
	rep.sections = slices.DeleteFunc(rep.sections, func(s section) bool { return len(s.rows) == 0 })
	return rep
}

// e2e returns the end-to-end result named name, the run with the
// median rate when it ran more than once, or nil.
func (r *Results) e2e(name string) *e2eResult {
	runs := r.e2eAll(name)
	if len(runs) == 0 {
		return nil
	}
	slices.SortFunc(runs, func(a, b *e2eResult) int { return cmp.Compare(a.Rate, b.Rate) })
	return runs[(len(runs)-1)/2]
}

// e2eAll returns every run named name.
func (r *Results) e2eAll(name string) []*e2eResult {
	var runs []*e2eResult
	for i := range r.E2E {
		if r.E2E[i].Run.Name == name {
			runs = append(runs, &r.E2E[i])
		}
	}
	return runs
}

func (r *Results) e2eRate(name string) float64 {
	if e := r.e2e(name); e != nil {
		return e.Rate
	}
	return 0
}

// e2eSpread is "min-max" of the rates of the runs named name, or "".
func (r *Results) e2eSpread(name string) string {
	runs := r.e2eAll(name)
	if len(runs) < 2 {
		return ""
	}
	lo, hi := runs[0].Rate, runs[0].Rate
	for _, e := range runs {
		lo, hi = min(lo, e.Rate), max(hi, e.Rate)
	}
	return fmt.Sprintf(" (%d runs: %s-%s)", len(runs), num(lo), num(hi))
}

// jsCeiling is raw JetStream consume-and-ack at perMsg readings per
// message, in readings/s.
func (r *Results) jsCeiling(perMsg int) (consume, pipeline float64) {
	for _, j := range r.RawJS {
		if j.perMsg == perMsg {
			return j.consume * float64(perMsg), j.pipeline * float64(perMsg)
		}
	}
	return 0, 0
}

// ingestCeiling1 is min(raw Badger, raw JetStream consume-and-ack at 1
// reading per message).
func (r *Results) ingestCeiling1() float64 {
	js, _ := r.jsCeiling(1)
	if js == 0 || r.RawBadger == 0 {
		return 0
	}
	return min(js, r.RawBadger)
}

func ingestSection(r *Results) section {
	s := section{title: "Ingest throughput", header: []string{"measure", "readings/s", "compared with", "ratio"}}
	add := func(name string, v float64, ref string, refV float64) {
		if v > 0 {
			s.rows = append(s.rows, []string{name, num(v), ref, ratio(v, refV)})
		}
	}
	for _, v := range r.RawBadgerVariants {
		add("raw Badger: "+v.Name, v.Rate, "", 0)
	}
	for _, j := range r.RawJS {
		n := float64(j.perMsg)
		add(fmt.Sprintf("raw JetStream %d/msg: async publish", j.perMsg), j.publish*n, "", 0)
		add(fmt.Sprintf("raw JetStream %d/msg: consume+ack, stream filled first", j.perMsg), j.consume*n, "", 0)
		add(fmt.Sprintf("raw JetStream %d/msg: publish and consume+ack at once", j.perMsg), j.pipeline*n, "", 0)
	}
	add(fmt.Sprintf("store.Write, %d readings per call", storeBatch), r.StoreWrite, "raw Badger", r.RawBadger)
	add("end to end 1/msg", r.e2eRate("1/msg"), "min(raw Badger, raw JetStream 1/msg consume+ack)", r.ingestCeiling1())
	_, pipe1 := r.jsCeiling(1)
	add("end to end 1/msg", r.e2eRate("1/msg"), "raw JetStream 1/msg publish and consume+ack at once", pipe1)
	add("end to end 100/msg", r.e2eRate("100/msg"), "raw Badger", r.RawBadger)
	add("end to end 100/msg", r.e2eRate("100/msg"), "VictoriaMetrics, 100-line requests", peerRate100)
	add("end to end 10000/msg", r.e2eRate("10000/msg"), "VictoriaMetrics, 10,000-line requests", peerRate10000)
	s.notes = []string{"Raw Badger writes one entry per reading (key <device>/<inverted ticks>, one value record: the layout before blocks) on a DB with the hot table options; the baseline (raw Badger below and in the targets) is the better of its variants.",
		"A message of N readings is N readings for the JetStream rows (messages/s = readings/s / N)."}
	return s
}

func e2eSection(r *Results) section {
	s := section{title: "End to end: publish to committed, telemetryd child process with embedded NATS",
		header: []string{"run", "readings", "publish alone/s", "publish to stored/s", "service CPU s per M readings",
			"publisher CPU s per M", "service peak RSS", "disk bytes/reading"}}
	for _, run := range e2eRuns() {
		e := r.e2e(run.Name)
		if e == nil {
			continue
		}
		s.rows = append(s.rows, []string{e.Run.Name, num(float64(e.Readings)), num(e.PublishRate), num(e.Rate) + r.e2eSpread(run.Name),
			fmt.Sprintf("%.2f", cpuPerMillion(e.ServiceCPU, e.Readings)),
			fmt.Sprintf("%.2f", cpuPerMillion(e.ClientCPU, e.Readings)),
			mib(e.PeakRSS), fmt.Sprintf("%.1f", float64(e.DiskBytes)/float64(e.Readings))})
	}
	for _, n := range []string{"1/msg", "100/msg"} {
		on, off, sync := r.e2eRate(n), r.e2eRate(n+" telemetry off"), r.e2eRate(n+" sync-writes")
		s.notes = append(s.notes, fmt.Sprintf("%s: telemetry on/off = %s; sync-writes/async = %s.", n, ratio(on, off), ratio(sync, on)))
	}
	small, large := r.e2e("100/msg memory-limit 512MiB"), r.e2e("100/msg memory-limit 4GiB")
	if small != nil && large != nil {
		s.notes = append(s.notes, fmt.Sprintf("100/msg: -memory-limit 512MiB/4GiB = %s (target at least 0.80); peak RSS %s and %s.",
			ratio(small.Rate, large.Rate), mib(small.PeakRSS), mib(large.PeakRSS)))
	}
	s.notes = append(s.notes, "Disk is the day tables after the service stopped (memtables flushed), before any forced compaction.",
		syncNote())
	return s
}

func querySection(q *queryResult) section {
	lat := func(l latency) string { return ms(l.P50) + " / " + ms(l.P99) }
	s := section{title: fmt.Sprintf("Queries at %s readings over the devices (p50 / p99)", num(float64(q.Readings))),
		header: []string{"condition", "latest-10", fmt.Sprintf("1-hour range (%s readings)", num(float64(q.RangeReadings))),
			"ingest readings/s", "service CPU cores"}}
	s.rows = [][]string{
		{"raw Badger prefix seek, table opened read-only", lat(q.RawLatest), lat(q.RawRange), "-", "-"},
		{"HTTP, idle", lat(q.IdleLatest), lat(q.IdleRange), "0", "-"},
	}
	for _, l := range q.Loaded {
		s.rows = append(s.rows, []string{"HTTP, under " + l.name(), lat(l.Latest), lat(l.Range), num(l.Rate), fmt.Sprintf("%.2f", l.Cores)})
	}
	s.rows = append(s.rows,
		[]string{"target p99", ms(targetLatestIdle) + " idle, " + ms(targetLatestLoad) + " under full-speed ingest", ms(targetRange), "", ""},
		[]string{"VictoriaMetrics, latest value", ms(peerLatestP50) + " / " + ms(peerLatestP99), "-", "", ""})
	s.notes = []string{
		fmt.Sprintf("Readings prefilled through store.Write at %s readings/s into day table %s; raw Badger reads a copy of the same readings written one entry per reading.",
			num(q.PrefillRate), q.Day),
		"HTTP times are client-side: request sent to the whole body read, one keep-alive connection, one request at a time; under ingest, latest-10 reads today's table while it is being written.",
		fmt.Sprintf("Idle: measured once the service, started on the data, had used under 0.05 CPU seconds in a second (after %s of compactions); %d CPUs.",
			q.Settle.Round(time.Second), runtime.NumCPU()),
	}
	return s
}

func diskSection(r *Results) section {
	q := r.Query
	per := func(b int64) string { return fmt.Sprintf("%.1f", float64(b)/float64(q.Readings)) }
	return section{title: "Disk and memory (query data)", header: []string{"measure", "value"},
		rows: [][]string{
			{"bytes/reading, as written by store.Write (store closed)", per(q.DiskPrefill)},
			{"bytes/reading, after the service ran on it", per(q.DiskService)},
			{"bytes/reading, after Badger Flatten", per(q.DiskCompacted)},
			{"service peak RSS (VmHWM) over the query measurement", mib(q.PeakRSS)},
		}}
}

func targetSection(r *Results) section {
	s := section{title: "Targets", header: []string{"target", "measured", "met"}}
	add := func(name, measured string, ok bool, have bool) {
		if have {
			s.rows = append(s.rows, []string{name, measured, met(ok)})
		}
	}
	_, pipe1 := r.jsCeiling(1)
	e1 := r.e2eRate("1/msg")
	add(fmt.Sprintf("end to end 1/msg >= %.1f x raw JetStream 1/msg publish and consume+ack at once", targetPipelineRatio),
		fmt.Sprintf("%s of %s = %s", num(e1), num(pipe1), ratio(e1, pipe1)), e1 >= targetPipelineRatio*pipe1, e1 > 0 && pipe1 > 0)
	e100 := r.e2eRate("100/msg")
	add(fmt.Sprintf("end to end 100/msg >= %.1f x raw Badger (one entry per reading)", targetBlocksRatio),
		fmt.Sprintf("%s of %s = %s", num(e100), num(r.RawBadger), ratio(e100, r.RawBadger)), e100 >= targetBlocksRatio*r.RawBadger, e100 > 0 && r.RawBadger > 0)
	for _, n := range []string{"1/msg", "100/msg"} {
		on, off := r.e2eRate(n), r.e2eRate(n+" telemetry off")
		add(fmt.Sprintf("telemetry on >= 0.9 x off, %s", n), ratio(on, off), on >= targetTelemetry*off, on > 0 && off > 0)
	}
	if q := r.Query; q != nil {
		add("latest-10 over HTTP p99 <= 1 ms idle", ms(q.IdleLatest.P99), q.IdleLatest.P99 <= targetLatestIdle, q.IdleLatest.N > 0)
		full := q.fullSpeed()
		add("latest-10 over HTTP p99 <= 5 ms under full-speed ingest", ms(full.Latest.P99), full.Latest.P99 <= targetLatestLoad, full.Latest.N > 0)
		add("1-hour range over HTTP p99 <= 5 ms (idle)", ms(q.IdleRange.P99), q.IdleRange.P99 <= targetRange, q.IdleRange.N > 0)
		add("1-hour range over HTTP p99 <= 5 ms (under full-speed ingest, for information)", ms(full.Range.P99), full.Range.P99 <= targetRange, full.Range.N > 0)
		for _, l := range q.Loaded {
			if l.Target > 0 {
				add(fmt.Sprintf("latest-10 p99 <= 5 ms under %s (for information)", l.name()), ms(l.Latest.P99), l.Latest.P99 <= targetLatestLoad, l.Latest.N > 0)
			}
		}
		b := float64(q.DiskCompacted) / float64(q.Readings)
		add("bytes on disk per 3-value reading <= 40 after compaction", fmt.Sprintf("%.1f", b), b <= targetDiskBytes, q.DiskCompacted > 0)
	}
	s.notes = []string{strings.Join([]string{
		"Peer (VictoriaMetrics, same readings, same kind of machine): 340,000 readings/s in 10,000-line requests,",
		"190,000/s in 100-line requests, latest value p50 0.2 ms / p99 0.6 ms; it acknowledges writes before they are durable,",
		"telemetryd acks a message only after its readings are committed to Badger."}, " ")}
	return s
}

// syncNote is the report's note on the runs' sizes.
func syncNote() string {
	if syncShare == 1 {
		return "Runs done more than once show the median run and the range of the rates; -sync-writes runs publish as many readings as the others."
	}
	return fmt.Sprintf("Runs done more than once show the median run and the range of the rates; -sync-writes runs publish 1/%d of the readings.", syncShare)
}
