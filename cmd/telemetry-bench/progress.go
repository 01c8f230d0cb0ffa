package main

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

// progress writes timestamped progress lines while the benchmark works.
type progress struct {
	w     io.Writer
	every time.Duration
	start time.Time

	mu sync.Mutex // serializes lines
}

func newProgress(w io.Writer, every time.Duration) *progress {
	return &progress{w: w, every: every, start: time.Now()}
}

// logf writes one line prefixed with the time since the run started.
func (p *progress) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, "[%6.1fs] %s\n", time.Since(p.start).Seconds(), fmt.Sprintf(format, args...))
}

// phase is one measurement in progress: a counter that a ticker reports
// until end is called.
type phase struct {
	p     *progress
	name  string
	unit  string
	total int64
	start time.Time
	n     atomic.Int64

	stop     chan struct{}
	finished chan struct{}
	once     sync.Once
}

// begin starts reporting a phase of total units (0: unknown).
func (p *progress) begin(name string, total int, unit string) *phase {
	ph := &phase{p: p, name: name, unit: unit, total: int64(total), start: time.Now(),
		stop: make(chan struct{}), finished: make(chan struct{})}
	p.logf("%s: start", name)
	go ph.report()
	return ph
}

// add counts n more units done. A nil phase counts nothing.
func (ph *phase) add(n int) {
	if ph != nil {
		ph.n.Add(int64(n))
	}
}

// set sets the units done.
func (ph *phase) set(n int64) { ph.n.Store(n) }

func (ph *phase) report() {
	defer close(ph.finished)
	if ph.p.every <= 0 {
		<-ph.stop
		return
	}
	t := time.NewTicker(ph.p.every)
	defer t.Stop()
	for {
		select {
		case <-ph.stop:
			return
		case <-t.C:
			ph.line("")
		}
	}
}

func (ph *phase) line(suffix string) {
	n, secs := ph.n.Load(), time.Since(ph.start).Seconds()
	of := ""
	if ph.total > 0 {
		of = fmt.Sprintf("/%d", ph.total)
	}
	ph.p.logf("%s: %d%s %s, %.0f %s/s%s", ph.name, n, of, ph.unit, float64(n)/max(secs, 1e-9), ph.unit, suffix)
}

// end stops reporting and writes the final line with the result.
func (ph *phase) end(result string) {
	ph.once.Do(func() {
		close(ph.stop)
		<-ph.finished
		ph.p.logf("%s: done in %.1fs: %s", ph.name, time.Since(ph.start).Seconds(), result)
	})
}
