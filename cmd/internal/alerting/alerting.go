// Package alerting holds telemetryd's alerting flags and wires the rule
// evaluator (api/rules) to the service: the engine it queries, the
// JetStream bucket that keeps alert state, the write path that stores
// recording rules' results, and the receivers it notifies.
package alerting

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"

	"github.com/telemetryd/telemetryd/api/rules"
	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
)

// Config is the alerting configuration; without Rules nothing here runs.
type Config struct {
	Rules          string
	Alertmanagers  []string
	Webhooks       []string
	ExternalLabels string
	ExternalURL    string
	EvalSlots      int
}

// Default returns the defaults: no rules.
func Default() Config { return Config{EvalSlots: rules.DefaultEvalSlots} }

// list is a repeatable flag.
type list struct{ v *[]string }

func (l list) String() string {
	if l.v == nil {
		return ""
	}
	return strings.Join(*l.v, ",")
}

func (l list) Set(s string) error {
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l.v = append(*l.v, p)
		}
	}
	return nil
}

// Bind registers the alerting flags on fs.
func (c *Config) Bind(fs *flag.FlagSet) {
	fs.StringVar(&c.Rules, "rules", c.Rules, "evaluate the Prometheus rule files these globs match (comma-separated), recording and alerting (api/rules/README.md); reloaded on SIGHUP and POST /-/reload (empty: off)")
	fs.Var(list{&c.Alertmanagers}, "alertmanager-url", "send alerts to this Alertmanager (API v2), e.g. http://alertmanager:9093; repeat or separate with commas for several")
	fs.Var(list{&c.Webhooks}, "alert-webhook-url", "POST alerts as JSON to this URL (api/rules/README.md); repeat or separate with commas for several")
	fs.StringVar(&c.ExternalLabels, "alert-external-labels", c.ExternalLabels, "labels added to every alert sent, e.g. site=north,env=prod (an alert's own labels win)")
	fs.StringVar(&c.ExternalURL, "alert-external-url", c.ExternalURL, "the service's URL as users reach it: alerts link their expression on its page (empty: no link)")
	fs.IntVar(&c.EvalSlots, "rule-query-slots", c.EvalSlots, "how many rule queries run at once: the rules' share of the query engine, apart from the API's")
}

// Validate checks the flags that need no file system.
func (c *Config) Validate() error {
	var errs []error
	if _, err := c.externalLabels(); err != nil {
		errs = append(errs, err)
	}
	if c.ExternalURL != "" {
		if u, err := url.Parse(c.ExternalURL); err != nil || u.Host == "" {
			errs = append(errs, fmt.Errorf("-alert-external-url %q: want http(s)://host[/path]", c.ExternalURL))
		}
	}
	if c.EvalSlots < 1 {
		errs = append(errs, fmt.Errorf("-rule-query-slots %d must be at least 1", c.EvalSlots))
	}
	if c.Rules == "" && (len(c.Alertmanagers) > 0 || len(c.Webhooks) > 0) {
		errs = append(errs, errors.New("-alertmanager-url and -alert-webhook-url need -rules"))
	}
	return errors.Join(errs...)
}

func (c *Config) externalLabels() (labels.Labels, error) {
	m := map[string]string{}
	for _, kv := range strings.Split(c.ExternalLabels, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" || v == "" || !model.UTF8Validation.IsValidLabelName(k) {
			return labels.EmptyLabels(), fmt.Errorf("-alert-external-labels: %q is not name=value", kv)
		}
		m[k] = v
	}
	return labels.FromMap(m), nil
}

func (c *Config) globs() []string {
	var out []string
	for _, g := range strings.Split(c.Rules, ",") {
		if g = strings.TrimSpace(g); g != "" {
			out = append(out, g)
		}
	}
	return out
}

// Publisher stores readings (ingest.Publisher).
type Publisher interface {
	Publish(ctx context.Context, msgs []linemsg.Message) error
}

// Deps are what the evaluator needs of the service.
type Deps struct {
	Query rules.QueryFunc
	// Batch gives the queries of one group evaluation a common context
	// (rules.Config.Batch); nil: none.
	Batch func(ctx context.Context) context.Context
	// Keep lets a threshold's operand leave out the series no threshold
	// keeps (rules.Config.Keep); nil: none.
	Keep      func(ctx context.Context, keep func(float64) bool) context.Context
	JetStream jetstream.JetStream
	// Replicas of the state bucket when it is created.
	Replicas  int
	Publisher Publisher
	// Cluster gives each group to one node of a cluster at a time (nil:
	// a single node evaluates all).
	Cluster *Cluster
	Logger  *slog.Logger
	Now     func() time.Time
}

// Alerting is the running evaluator.
type Alerting struct {
	cfg      Config
	Manager  *rules.Manager
	notifier *rules.Notifier
	leases   *groupLeases // nil outside a cluster
	log      *slog.Logger
	mu       sync.Mutex // one reload at a time
	groups   []string   // names of the groups loaded
}

// StateBucket is the JetStream key-value bucket of alert state.
const StateBucket = "TELEMETRY_ALERTS"

// Open loads the rule files (a bad file is an error naming it) and
// builds the evaluator; Run starts it.
func Open(ctx context.Context, c Config, d Deps) (*Alerting, error) {
	groups, err := rules.Load(c.globs(), 0)
	if err != nil {
		return nil, err
	}
	ext, err := c.externalLabels()
	if err != nil {
		return nil, err
	}
	var recv []rules.Receiver
	for _, u := range c.Alertmanagers {
		recv = append(recv, rules.Receiver{Kind: rules.KindAlertmanager, URL: u})
	}
	for _, u := range c.Webhooks {
		recv = append(recv, rules.Receiver{Kind: rules.KindWebhook, URL: u})
	}
	n, err := rules.NewNotifier(rules.NotifierConfig{Receivers: recv, Logger: d.Logger})
	if err != nil {
		return nil, err
	}
	kv, err := d.JetStream.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: StateBucket, Description: "telemetryd alert state, one entry per rule group",
		History: 1, MaxBytes: 256 << 20, Storage: jetstream.FileStorage, Replicas: max(d.Replicas, 1),
	})
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("alert state bucket %s: %w", StateBucket, err)
	}
	var extURL *url.URL
	if c.ExternalURL != "" {
		extURL, _ = url.Parse(strings.TrimSuffix(c.ExternalURL, "/"))
	}
	var leases *groupLeases
	var lease func(string) bool
	if d.Cluster != nil {
		now := d.Now
		if now == nil {
			now = time.Now
		}
		leases = newGroupLeases(kv, *d.Cluster, now, d.Logger)
		lease = leases.Held
	}
	m, err := rules.NewManager(rules.Config{Query: d.Query, Batch: d.Batch, Keep: d.Keep, Recorder: recorder{d.Publisher}, States: kvStates{kv},
		Sender: n, Lease: lease, ExternalLabels: ext, ExternalURL: extURL, EvalSlots: c.EvalSlots,
		Logger: d.Logger, Now: d.Now})
	if err != nil {
		n.Close()
		return nil, err
	}
	m.Update(groups)
	nr := 0
	for _, g := range groups {
		nr += len(g.Rules)
	}
	d.Logger.Info("rules loaded", "groups", len(groups), "rules", nr, "alertmanagers", len(c.Alertmanagers), "webhooks", len(c.Webhooks))
	return &Alerting{cfg: c, Manager: m, notifier: n, leases: leases, log: d.Logger, groups: groupNames(groups)}, nil
}

// Run starts the groups' evaluation.
func (a *Alerting) Run() { a.Manager.Run() }

// Reload loads the rule files again: a bad file is refused (the error
// names it) and the old rules stay.
func (a *Alerting) Reload(context.Context) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	groups, err := rules.Load(a.cfg.globs(), 0)
	if err != nil {
		a.log.Error("rules not reloaded; the old ones stay", "err", err)
		return err
	}
	a.Manager.Update(groups)
	names := groupNames(groups)
	if a.leases != nil {
		var gone []string
		for _, g := range a.groups {
			if !slices.Contains(names, g) {
				gone = append(gone, g)
			}
		}
		a.leases.Release(gone...)
	}
	a.groups = names
	a.log.Info("rules reloaded", "groups", len(groups))
	return nil
}

func groupNames(gs []*rules.Group) []string {
	out := make([]string, len(gs))
	for i, g := range gs {
		out[i] = g.Key()
	}
	return out
}

// Close stops the evaluation and the senders, and lets the groups this
// node evaluates go to the others.
func (a *Alerting) Close() {
	a.Manager.Stop()
	if a.leases != nil {
		a.leases.ReleaseAll()
	}
	a.notifier.Close()
}

// kvStates keeps each group's state in the bucket under a key made of
// its name.
type kvStates struct{ kv jetstream.KeyValue }

func stateKey(group string) string { return "g." + hex.EncodeToString([]byte(group)) }

func (s kvStates) Load(ctx context.Context, key string) ([]byte, error) {
	e, err := s.kv.Get(ctx, stateKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return e.Value(), nil
}

func (s kvStates) Save(ctx context.Context, key string, b []byte) error {
	_, err := s.kv.Put(ctx, stateKey(key), b)
	return err
}

// recorder publishes recording rules' results as readings, one message
// per device, like any other write.
type recorder struct{ pub Publisher }

func (r recorder) Record(ctx context.Context, rs []buckets.Reading) error {
	if r.pub == nil {
		return errors.New("recording rules need the write path")
	}
	msgs := make([]linemsg.Message, 0, len(rs))
	var e wire.Encoder
	for _, rd := range rs {
		e.Reset()
		e.Add(rd.Ticks, rd.Values)
		msgs = append(msgs, linemsg.Message{Device: string(rd.Device), Data: e.Append(nil),
			Header: map[string]string{wire.Header: wire.Format}})
	}
	return r.pub.Publish(ctx, msgs)
}
