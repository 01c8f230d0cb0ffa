package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// The fsync scaling measurement (-fsync-files): how many fsyncs per
// second the file system of the work dir completes when N files are
// written at once, one writer per file, each write of fsyncRecord bytes
// followed by an fsync, for -fsync-seconds. One stream's file store
// fsyncs one write at a time under its lock; streams of their own
// (one per partition) fsync at once, and this says how far that scales
// on the machine.

// fsyncRecord is the size of each write: about one small JSON message
// as a stream stores it.
const fsyncRecord = 256

// fsyncResult is one row: files written at once and the fsyncs all of
// them completed per second.
type fsyncResult struct {
	Files   int
	Fsyncs  int64
	Elapsed time.Duration
}

// rate is fsyncs per second, all files together.
func (r fsyncResult) rate() float64 { return float64(r.Fsyncs) / r.Elapsed.Seconds() }

// runFsync measures every count of cfg.FsyncFiles in turn and prints
// the table to stdout.
func runFsync(ctx context.Context, cfg Config, stdout, progressOut io.Writer) error {
	work, err := os.MkdirTemp(cfg.WorkDir, "telemetry-fsync-")
	if err != nil {
		return err
	}
	defer removeAll(work, cfg.Keep)
	prog := newProgress(progressOut, cfg.Progress)
	var rows []fsyncResult
	for _, n := range cfg.FsyncFiles {
		ph := prog.begin(fmt.Sprintf("fsync %d files at once for %s", n, cfg.FsyncFor), 0, "")
		r, err := measureFsync(ctx, filepath.Join(work, fmt.Sprint(n)), n, cfg.FsyncFor)
		if err != nil {
			return err
		}
		ph.end(fmt.Sprintf("%s fsyncs/s", num(r.rate())))
		rows = append(rows, r)
	}
	fmt.Fprintf(stdout, "fsync scaling in %s (%d-byte writes, each followed by an fsync, one writer per file)\n\n", work, fsyncRecord)
	fmt.Fprintln(stdout, "| files written at once | fsyncs/s, all files together | per file | vs 1 file |")
	fmt.Fprintln(stdout, "|---|---|---|---|")
	for _, r := range rows {
		vs := "-"
		if rows[0].Files == 1 && rows[0].rate() > 0 {
			vs = fmt.Sprintf("%.1fx", r.rate()/rows[0].rate())
		}
		fmt.Fprintf(stdout, "| %d | %s | %s | %s |\n", r.Files, num(r.rate()), num(r.rate()/float64(r.Files)), vs)
	}
	return nil
}

// measureFsync writes n files in dir at once for d.
func measureFsync(ctx context.Context, dir string, n int, d time.Duration) (fsyncResult, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fsyncResult{}, err
	}
	files := make([]*os.File, n)
	for i := range files {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("f%03d", i)))
		if err != nil {
			return fsyncResult{}, err
		}
		defer f.Close()
		files[i] = f
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var (
		total atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	rec := make([]byte, fsyncRecord)
	start := time.Now()
	for _, f := range files {
		wg.Go(func() {
			for ctx.Err() == nil {
				if _, err := f.Write(rec); err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
				if err := f.Sync(); err != nil {
					mu.Lock()
					first = err
					mu.Unlock()
					return
				}
				total.Add(1)
			}
		})
	}
	wg.Wait()
	return fsyncResult{Files: n, Fsyncs: total.Load(), Elapsed: time.Since(start)}, first
}
