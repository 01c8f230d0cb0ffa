package ingest

import (
	"sync"
	"time"
)

// Sampling of the per-message "message rejected" log line: a flood of
// invalid messages must not become a flood of log lines. Each interval
// logs the first rejectLogBurst rejections in full; the rest are only
// counted, and the count rides on the next line logged.
const (
	rejectLogInterval = 10 * time.Second
	rejectLogBurst    = 10
)

// logSampler lets through at most burst lines per interval.
type logSampler struct {
	burst    int
	interval time.Duration

	mu         sync.Mutex
	start      time.Time
	n          int
	suppressed int64
}

// allow reports whether a line may be logged at now, and how many were
// held back since the last one that was.
func (s *logSampler) allow(now time.Time) (bool, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.start) >= s.interval {
		s.start, s.n = now, 0
	}
	if s.n >= s.burst {
		s.suppressed++
		return false, 0
	}
	s.n++
	held := s.suppressed
	s.suppressed = 0
	return true, held
}
