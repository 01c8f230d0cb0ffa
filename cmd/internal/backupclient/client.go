// Package backupclient is a client of POST /v1/backup: it asks a
// running telemetryd to back its data up into a directory on the
// service's machine, and writes backup and restore reports for people.
package backupclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/store/backup"
)

// DefaultTimeout is the default Client.Timeout: a backup request runs
// for as long as the copy takes.
const DefaultTimeout = 24 * time.Hour

// maxAnswerBytes bounds the answer read.
const maxAnswerBytes = 1 << 20

// Client asks one service for backups. Create it with New.
type Client struct {
	base, endpoint, token string
	// HTTP sends the requests; default http.DefaultClient.
	HTTP *http.Client
	// Timeout bounds one backup request; default DefaultTimeout.
	Timeout time.Duration
}

// New is a client of the service at base (http://HOST:PORT) that sends
// token, if not empty, as its bearer token (admin scope).
func New(base, token string) (*Client, error) {
	endpoint := strings.TrimRight(base, "/") + "/v1/backup"
	if _, err := url.Parse(endpoint); err != nil {
		return nil, err
	}
	return &Client{base: base, endpoint: endpoint, token: token}, nil
}

// Backup asks the service to back up into dir, an absolute path on the
// service's machine under its backup root, copying everything if full.
// A refusal is returned with the service's status and message.
func (c *Client) Backup(ctx context.Context, dir string, full bool) (api.BackupSummary, error) {
	body, err := json.Marshal(api.BackupRequest{Dir: dir, Full: full})
	if err != nil {
		return api.BackupSummary{}, err
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return api.BackupSummary{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	res, err := hc.Do(req)
	if err != nil {
		return api.BackupSummary{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, maxAnswerBytes))
	if err != nil {
		return api.BackupSummary{}, err
	}
	if res.StatusCode != http.StatusOK {
		return api.BackupSummary{}, fmt.Errorf("%s answered %s: %s", c.base, res.Status, strings.TrimSpace(string(b)))
	}
	var sum api.BackupSummary
	if err := json.Unmarshal(b, &sum); err != nil {
		return api.BackupSummary{}, fmt.Errorf("answer: %w", err)
	}
	return sum, nil
}

// SummaryOf is the summary of the backup m in dir, as POST /v1/backup
// answers it.
func SummaryOf(dir string, m backup.Manifest) api.BackupSummary {
	return api.BackupSummary{Dir: dir, ID: m.ID, Created: m.Created, Tables: len(m.Tables), Skipped: m.Skipped,
		CopiedFiles: m.CopiedFiles, CopiedBytes: m.CopiedBytes, TotalBytes: m.TotalBytes(), Positions: m.Sequences()}
}

// PrintProgress prints one line per database to w; verb says what was
// done to it ("copied", "loaded").
func PrintProgress(w io.Writer, verb string) func(backup.Progress) {
	return func(p backup.Progress) {
		if p.Skipped {
			fmt.Fprintf(w, "[%d/%d] %s unchanged\n", p.Done, p.Total, p.Name)
			return
		}
		fmt.Fprintf(w, "[%d/%d] %s %s %s\n", p.Done, p.Total, p.Name, verb, SizeText(p.Bytes))
	}
}

// PrintSummary prints what a backup copied and its stream positions.
func PrintSummary(w io.Writer, s api.BackupSummary) {
	fmt.Fprintf(w, "backup %d in %s: %d tables (%d unchanged), copied %d files, %s; a restore loads %s\n",
		s.ID, s.Dir, s.Tables, s.Skipped, s.CopiedFiles, SizeText(s.CopiedBytes), SizeText(s.TotalBytes))
	fmt.Fprintf(w, "stream positions: %s\n", PositionsText(s.Positions))
}

// PositionsText writes stream positions for people, streams in order.
func PositionsText(pos map[string]uint64) string {
	if len(pos) == 0 {
		return "none saved (a service started on a restore reads its streams from their start)"
	}
	names := make([]string, 0, len(pos))
	for n := range pos {
		names = append(names, n)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = fmt.Sprintf("%s after %d", n, pos[n])
	}
	return strings.Join(parts, ", ")
}

// SizeText writes n bytes for people.
func SizeText(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
