package buckets

import (
	"context"
	"fmt"
	"slices"
	"sync"
)

// MaxWarnings is the most warnings one answer carries; past it, the
// last one says how many more there were.
const MaxWarnings = 10

// Warnings collects the warnings of one answer: problems that did not
// stop a query but that its caller must know about, such as a damaged
// block the store skipped. It is safe for concurrent use.
type Warnings struct {
	mu    sync.Mutex
	list  []string
	extra int
}

type warningsKey struct{}

// WithWarnings returns a context whose readers report their warnings
// into the returned collector.
func WithWarnings(ctx context.Context) (context.Context, *Warnings) {
	w := &Warnings{}
	return context.WithValue(ctx, warningsKey{}, w), w
}

// Warn adds msg to the warnings of the answer ctx is for, once; without
// a collector (WithWarnings) it does nothing.
func Warn(ctx context.Context, msg string) {
	w, _ := ctx.Value(warningsKey{}).(*Warnings)
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case slices.Contains(w.list, msg):
	case len(w.list) < MaxWarnings:
		w.list = append(w.list, msg)
	default:
		w.extra++
	}
}

// List returns the warnings collected so far, nil when there are none.
func (w *Warnings) List() []string {
	if w == nil {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	out := slices.Clone(w.list)
	if w.extra > 0 {
		out = append(out, fmt.Sprintf("and %d more warnings", w.extra))
	}
	return out
}

// WarningsOf returns the collector of ctx (WithWarnings), or nil; the
// List of nil is empty.
func WarningsOf(ctx context.Context) *Warnings {
	w, _ := ctx.Value(warningsKey{}).(*Warnings)
	return w
}
