package exportclient

import (
	"fmt"
	"io"
	"time"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets"
)

// Options is q for api.Export, which writes the same stream from a
// store (a stopped service's data dir) without a service: From and To
// parsed as the service parses them, an empty To meaning no end.
func (q Query) Options() (api.ExportOptions, error) {
	o := api.ExportOptions{Match: q.Match, Prefix: q.Prefix, Format: q.Format}
	var err error
	if q.From != "" {
		if o.From, err = buckets.ParseTime(q.From); err != nil {
			return o, fmt.Errorf("from: %w", err)
		}
	}
	if q.To != "" {
		if o.To, err = buckets.ParseTime(q.To); err != nil {
			return o, fmt.Errorf("to: %w", err)
		}
	}
	return o, nil
}

// Progress reports an export's running count and rate to W, each line
// headed by Prefix: Update at most once per Every, Done always. Start
// it with NewProgress.
type Progress struct {
	W           io.Writer
	Prefix      string
	Every       time.Duration
	start, next time.Time
}

// NewProgress is a Progress that starts now.
func NewProgress(w io.Writer, prefix string, every time.Duration) *Progress {
	now := time.Now()
	return &Progress{W: w, Prefix: prefix, Every: every, start: now, next: now.Add(every)}
}

// Update reports n readings written when the last report is old enough.
func (p *Progress) Update(n int64) {
	if now := time.Now(); now.After(p.next) {
		p.next = now.Add(p.Every)
		fmt.Fprintf(p.W, "%s%d readings, %.0f/s\n", p.Prefix, n, float64(n)/now.Sub(p.start).Seconds())
	}
}

// Done reports the total n, the time taken and the rate.
func (p *Progress) Done(n int64) {
	d := time.Since(p.start)
	fmt.Fprintf(p.W, "%s%d readings in %s (%.0f/s)\n", p.Prefix, n, d.Round(time.Millisecond), float64(n)/d.Seconds())
}
