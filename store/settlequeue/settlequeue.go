// Package settlequeue is the compactor's queue of day tables to settle
// before they close: bounded, and coalescing a day queued twice into
// one job, whose waiters learn when the compactor tried it.
package settlequeue

import (
	"sync"

	"github.com/telemetryd/telemetryd/buckets"
)

// Job is a day waiting to be settled.
type Job struct {
	Day  buckets.Day
	done chan struct{}
}

// Done is closed once the compactor tried the day (Finish).
func (j *Job) Done() <-chan struct{} { return j.done }

// Finish says the compactor tried the day.
func (j *Job) Finish() { close(j.done) }

// Queue is the queue of days to settle.
type Queue struct {
	max   int
	mu    sync.Mutex
	jobs  []*Job
	byDay map[buckets.Day]*Job
	// wake has room for one signal: the compactor looks at the queue.
	wake chan struct{}
}

// New returns an empty queue of at most max days.
func New(max int) *Queue {
	return &Queue{max: max, byDay: make(map[buckets.Day]*Job), wake: make(chan struct{}, 1)}
}

// Add queues day, or returns the job already queued for it; nil when
// the queue is full.
func (q *Queue) Add(day buckets.Day) *Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	if j := q.byDay[day]; j != nil {
		return j
	}
	if len(q.jobs) >= q.max {
		return nil
	}
	j := &Job{Day: day, done: make(chan struct{})}
	q.jobs = append(q.jobs, j)
	q.byDay[day] = j
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return j
}

// Wake receives a signal when a day was queued.
func (q *Queue) Wake() <-chan struct{} { return q.wake }

// Take removes and returns every queued job, oldest first.
func (q *Queue) Take() []*Job {
	q.mu.Lock()
	defer q.mu.Unlock()
	jobs := q.jobs
	q.jobs = nil
	clear(q.byDay)
	return jobs
}

// Len is the number of queued jobs.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.jobs)
}
