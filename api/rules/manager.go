package rules

import (
	"context"
	"errors"
	"log/slog"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"

	"github.com/telemetryd/telemetryd/buckets"
)

// QueryFunc evaluates a PromQL expression at ts (the service's engine,
// promapi.API.Instant).
type QueryFunc func(ctx context.Context, expr string, ts time.Time) (promql.Vector, error)

// Recorder stores a recording rule's results as readings.
type Recorder interface {
	Record(ctx context.Context, rs []buckets.Reading) error
}

// StateStore keeps each group's alert state, so a restart or another
// node restores it. Load returns nil, nil when key has none.
type StateStore interface {
	Load(ctx context.Context, key string) ([]byte, error)
	Save(ctx context.Context, key string, state []byte) error
}

// Sender takes the alerts a group sends after an evaluation (the
// Notifier).
type Sender interface {
	Send(alerts []Notification)
}

// Defaults of Config.
const (
	DefaultResendDelay     = time.Minute
	DefaultOutageTolerance = time.Hour
	DefaultEvalSlots       = 1
	// saveEvery is how often an unchanged state is saved again, so its
	// age tells how long the evaluator was away.
	saveEvery = time.Minute
)

// Config configures a Manager. Query is required.
type Config struct {
	Query QueryFunc
	// Batch, when set, is called at the start of each evaluation of a
	// group, and after each recording rule of it, and the queries up to
	// the next call are made with the context it returns, so that they
	// can share their reads (promapi.SharedReads).
	Batch func(ctx context.Context) context.Context
	// Keep, when set, gives the query of a threshold's operand (see
	// threshold) a context that lets the engine leave out the series
	// every threshold of the group on that operand rejects
	// (promapi.KeepValues). The answer is filtered here all the same.
	Keep func(ctx context.Context, keep func(float64) bool) context.Context
	// Recorder stores recording rules' results; nil makes them fail.
	Recorder Recorder
	// States keeps alert state across restarts and nodes; nil: none.
	States StateStore
	// Sender is told the alerts to send; nil: none are sent.
	Sender Sender
	// Lease says whether this node evaluates the group of key now (a
	// cluster gives each group to one node); nil: always.
	Lease func(key string) bool
	// ExternalLabels are added to every alert sent (an alert's own
	// labels win) and are $externalLabels in templates.
	ExternalLabels labels.Labels
	// ExternalURL is $externalURL in templates and the base of the
	// alerts' generatorURL.
	ExternalURL *url.URL
	// ResendDelay is how often a firing alert is sent again. Default
	// DefaultResendDelay.
	ResendDelay time.Duration
	// OutageTolerance: saved state older than this is not restored.
	// Default DefaultOutageTolerance.
	OutageTolerance time.Duration
	// EvalSlots is the rules' share of the engine: how many rule
	// queries run at once. Default DefaultEvalSlots.
	EvalSlots int
	// DefaultInterval is the interval of a group that names none.
	DefaultInterval time.Duration
	Logger          *slog.Logger
	Now             func() time.Time
}

// Manager evaluates the loaded groups, each on its own ticker.
type Manager struct {
	cfg    Config
	log    *slog.Logger
	slots  chan struct{}
	series *seriesStore

	mu      sync.Mutex
	groups  []*group
	ctx     context.Context
	cancel  context.CancelFunc
	running bool
}

// NewManager returns a manager without groups; Update loads them, Run
// starts their evaluation.
func NewManager(cfg Config) (*Manager, error) {
	if cfg.Query == nil {
		return nil, errors.New("rules: Config.Query is required")
	}
	if cfg.ResendDelay <= 0 {
		cfg.ResendDelay = DefaultResendDelay
	}
	if cfg.OutageTolerance <= 0 {
		cfg.OutageTolerance = DefaultOutageTolerance
	}
	if cfg.EvalSlots <= 0 {
		cfg.EvalSlots = DefaultEvalSlots
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, slots: make(chan struct{}, cfg.EvalSlots), series: newSeriesStore()}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m, nil
}

// Update replaces the groups with gs. A group whose file, name and
// rules are unchanged keeps running with its alerts; an alerting rule
// kept (same name and expression) in a changed group keeps its alerts.
func (m *Manager) Update(gs []*Group) {
	m.mu.Lock()
	defer m.mu.Unlock()
	old := map[string]*group{}
	for _, g := range m.groups {
		old[g.spec.Key()] = g
	}
	var next []*group
	for _, spec := range gs {
		if o, ok := old[spec.Key()]; ok && sameGroup(o.spec, spec) {
			delete(old, spec.Key())
			next = append(next, o)
			continue
		}
		g := newGroup(m, spec)
		if o, ok := old[spec.Key()]; ok {
			g.inherit(o)
		}
		next = append(next, g)
	}
	for _, o := range old {
		o.stopAndWait()
		m.series.dropGroup(o.spec.Key())
	}
	for _, g := range next {
		if m.running && g.done == nil {
			g.start(m.ctx)
		}
	}
	m.groups = next
}

// Run starts the groups' evaluation; it returns at once.
func (m *Manager) Run() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.running = true
	for _, g := range m.groups {
		if g.done == nil {
			g.start(m.ctx)
		}
	}
}

// Stop stops every group and waits for its evaluation in progress.
func (m *Manager) Stop() {
	m.cancel()
	m.mu.Lock()
	gs := slices.Clone(m.groups)
	m.mu.Unlock()
	for _, g := range gs {
		g.stopAndWait()
	}
}

// EvalAt evaluates the group named name once at ts (when this node
// holds its lease), as its ticker would: for tools and tests that drive
// the clock themselves.
func (m *Manager) EvalAt(ctx context.Context, name string, ts time.Time) error {
	m.mu.Lock()
	var g *group
	for _, x := range m.groups {
		if x.spec.Name == name {
			g = x
		}
	}
	m.mu.Unlock()
	if g == nil {
		return errors.New("rules: no group " + name)
	}
	g.tick(ctx, ts)
	return nil
}

// snapshot returns the groups for the API.
func (m *Manager) snapshot() []*group {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.groups)
}

// acquire takes one of the rules' evaluation slots.
func (m *Manager) acquire(ctx context.Context) error {
	select {
	case m.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (m *Manager) release() { <-m.slots }

// SlotsInUse is how many rule queries run now, at most the
// configured EvalSlots: the part of the rules' share taken.
func (m *Manager) SlotsInUse() int { return len(m.slots) }

func sameGroup(a, b *Group) bool {
	if a.Interval != b.Interval || a.Limit != b.Limit || !labels.Equal(a.Labels, b.Labels) || len(a.Rules) != len(b.Rules) {
		return false
	}
	for i, r := range a.Rules {
		o := b.Rules[i]
		if r.Record != o.Record || r.Alert != o.Alert || r.Expr != o.Expr || r.For != o.For || r.KeepFiringFor != o.KeepFiringFor ||
			!labels.Equal(r.Labels, o.Labels) || !labels.Equal(r.Annotations, o.Annotations) {
			return false
		}
	}
	return true
}
