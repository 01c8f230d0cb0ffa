package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"time"
)

// A node that finds a day table damaged (a file the corrupt fault hit)
// refuses it, turns not ready and says in /readyz how to repair it.
// The harness then does what an operator following that advice would:
// POST /v1/tables/{day}/repair, which keeps what the damaged copy still
// reads and writes the stream's readings of the day on top. The checks
// then hold the node to every acked reading, as before the damage.

// repairAdvice finds the repair a /readyz answer advises.
var repairAdvice = regexp.MustCompile(`POST (/v1/tables/[0-9]{4}-[0-9]{2}-[0-9]{2}/repair)`)

// repairTimeout bounds one repair: a day table of a fault run is small.
const repairTimeout = 3 * time.Minute

// repairAdvised runs each repair the /readyz answer body of p advises
// and notes on p what it did.
func repairAdvised(ctx context.Context, p *proc, base string, body []byte) {
	for _, m := range repairAdvice.FindAllSubmatch(body, -1) {
		path := string(m[1])
		p.note(fmt.Sprintf("%s advised %s, done: %s", p.name, path, repairTable(ctx, base+path)))
	}
}

// repairTable posts a repair to url and says how it went.
func repairTable(ctx context.Context, url string) string {
	ctx, cancel := context.WithTimeout(ctx, repairTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "failed: " + err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("failed: %s: %s", resp.Status, lastLine(string(body)))
	}
	var rep struct {
		Salvaged   int64 `json:"salvaged"`
		FromStream int64 `json:"fromStream"`
		BadBlocks  int   `json:"badBlocks"`
		Skipped    int   `json:"skippedDevices"`
	}
	if err := json.Unmarshal(body, &rep); err != nil {
		return "answer not understood: " + err.Error()
	}
	return fmt.Sprintf("%d readings salvaged, %d from the stream, %d bad blocks, %d devices skipped",
		rep.Salvaged, rep.FromStream, rep.BadBlocks, rep.Skipped)
}

// operatorPass asks every node's /readyz once and runs the repairs they
// advise; a node that found a table damaged since the last fault says
// so only there. What it did is noted on the nodes.
func (c *cluster) operatorPass(ctx context.Context) {
	client := http.Client{Timeout: 2 * time.Second}
	for j, p := range c.nodes {
		if !p.running() {
			continue
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.urls[j]+"/readyz", nil)
		if err != nil {
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			continue // a node cut off or paused: the next pass asks again
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		if resp.StatusCode == http.StatusServiceUnavailable {
			repairAdvised(ctx, p, c.urls[j], body)
		}
	}
}

// operatorNotes takes every node's notes of repairs since last asked.
func (c *cluster) operatorNotes() []string {
	var out []string
	for _, p := range c.nodes {
		out = append(out, p.takeNotes()...)
	}
	return out
}
