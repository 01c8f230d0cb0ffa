package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/dgraph-io/badger/v4"
	lp "github.com/influxdata/line-protocol/v2/lineprotocol"

	"github.com/telemetryd/telemetryd/api/cluster/nodewire"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store"
	"github.com/telemetryd/telemetryd/store/diskuse"
)

// The TSBS measurement (-tsbs FILE) stores the data set of timescale/tsbs
// `tsbs_generate_data --use-case=iot --format=influx` twice: through
// store.Write (blocks), and as one Badger entry per reading (the layout
// before blocks, with the store's former key and value encoding), and
// reports write rate and bytes on disk after a clean close of each.
//
// Lines map as the service's line protocol endpoint maps them: the
// device is the "name" tag (truck_N), each field becomes the value
// <measurement>.<field> and each other tag the string value
// <measurement>.<tag>; the "readings" and "diagnostics" lines of one
// truck at one time merge into one reading. Bytes per value divide by
// the field values only (what TSBS and VictoriaMetrics count as
// samples), so the stored tag strings only make our figure worse.

// tsbsMsg is readings per message: devices publish in batches of 100.
const tsbsMsg = 100

// tsbsStats is what one pass stored.
type tsbsStats struct {
	readings, values int
	writeTime        time.Duration
	bytes            int64
}

// runTSBS measures both layouts on file and prints a report to out.
func runTSBS(ctx context.Context, cfg Config, file string, out, progress io.Writer) error {
	work := cfg.WorkDir
	if work == "" {
		dir, err := os.MkdirTemp("", "telemetry-bench-tsbs-")
		if err != nil {
			return err
		}
		work = dir
		defer removeAll(dir, cfg.Keep)
	}
	fmt.Fprintf(progress, "tsbs: store.Write pass\n")
	blocks, err := tsbsStore(ctx, file, filepath.Join(work, "store"))
	if err != nil {
		return err
	}
	fmt.Fprintf(progress, "tsbs: one Badger entry per reading pass\n")
	raw, err := tsbsRaw(file, filepath.Join(work, "raw"))
	if err != nil {
		return err
	}
	row := func(name string, s tsbsStats) {
		fmt.Fprintf(out, "| %s | %d | %d | %.0f | %d | %.2f | %.3f |\n", name, s.readings, s.values,
			float64(s.readings)/s.writeTime.Seconds(), s.bytes,
			float64(s.bytes)/float64(s.readings), float64(s.bytes)/float64(s.values))
	}
	fmt.Fprintf(out, "TSBS IoT data: %s\n\n", file)
	fmt.Fprintln(out, "| layout | readings | field values | writes/s (readings) | bytes on disk after close | B/reading | B/value |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|")
	row("blocks (store.Write, 5000 readings per call)", blocks)
	row("one Badger entry per reading (WriteBatch)", raw)
	fmt.Fprintf(out, "\nblocks / one entry per reading: write rate %.2fx, bytes %.3fx\n",
		(float64(blocks.readings)/blocks.writeTime.Seconds())/(float64(raw.readings)/raw.writeTime.Seconds()),
		float64(blocks.bytes)/float64(raw.bytes))
	return nil
}

// eachTSBSMessage parses file and calls fn with messages of up to
// tsbsMsg merged readings of one device, and the number of field values
// in them. Readings of a device are complete once a later time of the
// same device appears (the file is ordered by time). The calls come in
// the same order on every pass over the same file.
func eachTSBSMessage(file string, fn func(msg []buckets.Reading, values int) error) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	dec := lp.NewDecoder(bufio.NewReaderSize(f, 1<<20))
	type pending struct {
		cur    *buckets.Reading
		msg    []buckets.Reading
		values int
	}
	devs := map[string]*pending{}
	var order []string // devices in the order first seen, for the last messages
	curValues := map[string]int{}
	flushReading := func(p *pending, dev string) error {
		if p.cur == nil {
			return nil
		}
		if _, ok := buckets.SortValues(p.cur.Values); !ok {
			return fmt.Errorf("tsbs: duplicate value in %s", p.cur.PartitionKey())
		}
		p.msg = append(p.msg, *p.cur)
		p.values += curValues[dev]
		curValues[dev] = 0
		p.cur = nil
		if len(p.msg) == tsbsMsg {
			err := fn(p.msg, p.values)
			p.msg, p.values = nil, 0
			return err
		}
		return nil
	}
	for dec.Next() {
		m, err := dec.Measurement()
		if err != nil {
			return err
		}
		meas := string(m)
		var dev string
		var fields []buckets.Field
		for {
			k, v, err := dec.NextTag()
			if err != nil {
				return err
			}
			if k == nil {
				break
			}
			if string(k) == "name" {
				dev = string(v)
				continue
			}
			fields = append(fields, buckets.Field{Name: meas + "." + string(k), Value: buckets.String(string(v))})
		}
		nf := 0
		for {
			k, v, err := dec.NextField()
			if err != nil {
				return err
			}
			if k == nil {
				break
			}
			var val buckets.Value
			switch v.Kind() {
			case lp.Float:
				val = buckets.Float(v.FloatV())
			case lp.Int:
				val = buckets.Int(v.IntV())
			case lp.Uint:
				val = buckets.Int(int64(v.UintV()))
			case lp.Bool:
				val = buckets.Bool(v.BoolV())
			default:
				val = buckets.String(v.StringV())
			}
			fields = append(fields, buckets.Field{Name: meas + "." + string(k), Value: val})
			nf++
		}
		ts, err := dec.Time(lp.Nanosecond, time.Time{})
		if err != nil {
			return err
		}
		if dev == "" || nf == 0 {
			continue
		}
		k := buckets.MustTicks(ts)
		p := devs[dev]
		if p == nil {
			p = &pending{}
			devs[dev] = p
			order = append(order, dev)
		}
		if p.cur != nil && p.cur.Ticks != k {
			if err := flushReading(p, dev); err != nil {
				return err
			}
		}
		if p.cur == nil {
			p.cur = &buckets.Reading{Device: buckets.DeviceID(dev), Ticks: k}
		}
		p.cur.Values = append(p.cur.Values, fields...)
		curValues[dev] += nf
	}
	if err := dec.Err(); err != nil {
		return err
	}
	for _, dev := range order {
		p := devs[dev]
		if err := flushReading(p, dev); err != nil {
			return err
		}
		if len(p.msg) > 0 {
			if err := fn(p.msg, p.values); err != nil {
				return err
			}
		}
	}
	return nil
}

// tsbsStore writes file through store.Write, storeBatch readings per
// call, closes the store and measures its day tables.
func tsbsStore(ctx context.Context, file, dir string) (tsbsStats, error) {
	var st tsbsStats
	opts := store.DefaultOptions()
	opts.Logger = quietLogger()
	s, err := store.Open(ctx, dir, opts)
	if err != nil {
		return st, err
	}
	var batch []buckets.Reading
	write := func() error {
		start := time.Now()
		err := s.Write(ctx, batch)
		st.writeTime += time.Since(start)
		batch = batch[:0]
		return err
	}
	err = eachTSBSMessage(file, func(msg []buckets.Reading, values int) error {
		st.readings += len(msg)
		st.values += values
		batch = append(batch, msg...)
		if len(batch) >= storeBatch {
			return write()
		}
		return nil
	})
	if err == nil && len(batch) > 0 {
		err = write()
	}
	start := time.Now()
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	st.writeTime += time.Since(start) // the close merges the last open blocks
	if err != nil {
		return st, err
	}
	st.bytes = diskuse.Tree(filepath.Join(dir, "tables"))
	return st, nil
}

// tsbsRaw writes file as one Badger entry per reading (the store's key
// and the buckets value encoding) with WriteBatches, merging nothing
// (the parser already merged), and measures the directory after close.
func tsbsRaw(file, dir string) (tsbsStats, error) {
	var st tsbsStats
	db, err := badger.Open(store.TableBadgerOptions(dir, false, false, quietLogger()))
	if err != nil {
		return st, err
	}
	wb := db.NewWriteBatch()
	err = eachTSBSMessage(file, func(msg []buckets.Reading, values int) error {
		st.readings += len(msg)
		st.values += values
		start := time.Now()
		defer func() { st.writeTime += time.Since(start) }()
		for _, r := range msg {
			if err := wb.Set(appendRawKey(nil, r.Device, r.Ticks), nodewire.AppendValues(nil, r.Values)); err != nil {
				return err
			}
		}
		return nil
	})
	start := time.Now()
	if err == nil {
		err = wb.Flush()
	} else {
		wb.Cancel()
	}
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	st.writeTime += time.Since(start)
	if err != nil {
		return st, err
	}
	st.bytes = diskuse.Tree(dir)
	return st, nil
}
