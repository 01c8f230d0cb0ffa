// Package bucketstest holds the small helpers that the tests of the
// telemetry packages share, beside buckets the way net/http/httptest
// sits beside net/http: a log sink safe for concurrent writers, with a
// reader for slog JSON records, and a settable clock. It imports only
// the standard library.
package bucketstest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// SyncBuffer is a bytes.Buffer that many goroutines may write to (a
// logger's sink) while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns everything written so far.
func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Records parses what was written as slog JSON records, one a line,
// and returns those whose "msg" is msg (every record when msg is
// empty). A line that is not a JSON object is an error.
func (s *SyncBuffer) Records(msg string) ([]map[string]any, error) {
	var out []map[string]any
	for _, l := range strings.Split(s.String(), "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			return nil, fmt.Errorf("log line %q: %w", l, err)
		}
		if msg == "" || rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out, nil
}

// Clock is a clock that moves only when told, safe for concurrent use.
// Pass its Now method where a component takes a clock.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a clock standing at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Add moves the clock by d (backwards when d is negative).
func (c *Clock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set puts the clock at t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}
