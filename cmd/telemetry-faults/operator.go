package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"regexp"
	"strings"
	"time"
)

// A node that finds a day table damaged (a file the corrupt fault hit)
// refuses it, turns not ready and says in /readyz how to repair it.
// The harness then does what an operator following that advice would:
// it stops the node, runs `telemetryd repair -day D` on its data dir
// (which keeps what the damaged copy still reads; the node writes the
// stream's readings of the day again at its next start) and starts it.
// The running node's POST /v1/tables/D/repair is for loopback clients
// only without an auth file, which the harness is not. The checks then
// hold the node to every acked reading, as before the damage.

// repairAdvice finds the days a /readyz answer advises repairing.
var repairAdvice = regexp.MustCompile(`telemetryd repair -day ([0-9]{4}-[0-9]{2}-[0-9]{2})`)

// repairNeeded is waitReady's error for a node that advises repairs.
type repairNeeded struct{ days []string }

func (e *repairNeeded) Error() string {
	return "it advises repairing the day tables of " + strings.Join(e.days, ", ")
}

// advisedRepairs is the repair a /readyz answer body advises, or nil.
func advisedRepairs(body []byte) *repairNeeded {
	var days []string
	for _, m := range repairAdvice.FindAllSubmatch(body, -1) {
		days = append(days, string(m[1]))
	}
	if len(days) == 0 {
		return nil
	}
	return &repairNeeded{days: days}
}

// repairOffline stops node j, repairs the tables of days on its data
// dir and starts it again; it notes on the node what each repair said.
func (c *cluster) repairOffline(ctx context.Context, j int, days []string) error {
	p := c.nodes[j]
	p.stop(30 * time.Second)
	if err := p.kill(); err != nil {
		return err
	}
	for _, day := range days {
		out, err := exec.CommandContext(ctx, p.bin, "repair", "-data-dir", p.dataDir, "-day", day).CombinedOutput()
		what := strings.Join(strings.Fields(string(out)), " ")
		if err != nil {
			p.note(fmt.Sprintf("%s: telemetryd repair -day %s failed (%v): %s", p.name, day, err, lastLine(what)))
			continue
		}
		p.note(fmt.Sprintf("%s: telemetryd repair -day %s: %s", p.name, day, lastLine(what)))
	}
	return p.start()
}

// readyRepairing waits until node j is ready, as waitReady does, and
// runs the repairs it advises meanwhile (at most three rounds).
func (c *cluster) readyRepairing(ctx context.Context, j int, timeout time.Duration) error {
	var err error
	for range 3 {
		err = waitReady(ctx, c.nodes[j], c.urls[j], timeout)
		var rn *repairNeeded
		if !errors.As(err, &rn) {
			return err
		}
		if rerr := c.repairOffline(ctx, j, rn.days); rerr != nil {
			return rerr
		}
	}
	return err
}

// operatorPass asks every node's /readyz once and runs the repairs they
// advise; a node that found a table damaged since the last fault says
// so only there. What it did is noted on the nodes.
func (c *cluster) operatorPass(ctx context.Context) error {
	client := http.Client{Timeout: 2 * time.Second}
	var errs []error
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
		rn := advisedRepairs(body)
		if resp.StatusCode != http.StatusServiceUnavailable || rn == nil {
			continue
		}
		if err := c.repairOffline(ctx, j, rn.days); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := c.readyRepairing(ctx, j, 3*time.Minute); err != nil {
			errs = append(errs, fmt.Errorf("%s after its repair: %w", p.name, err))
		}
	}
	return errors.Join(errs...)
}

// operatorNotes takes every node's notes of repairs since last asked.
func (c *cluster) operatorNotes() []string {
	var out []string
	for _, p := range c.nodes {
		out = append(out, p.takeNotes()...)
	}
	return out
}
