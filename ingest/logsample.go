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

// LogSampler lets through at most Burst log lines per Interval and
// counts the rest, so a flood of events cannot become a flood of log
// lines. The service also uses it for its permission-violation line.
type LogSampler struct {
	Burst    int
	Interval time.Duration

	mu         sync.Mutex
	start      time.Time
	n          int
	suppressed int64
}

// Allow reports whether a line may be logged at now, and how many were
// held back since the last one that was.
func (s *LogSampler) Allow(now time.Time) (bool, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now.Sub(s.start) >= s.Interval {
		s.start, s.n = now, 0
	}
	if s.n >= s.Burst {
		s.suppressed++
		return false, 0
	}
	s.n++
	held := s.suppressed
	s.suppressed = 0
	return true, held
}
