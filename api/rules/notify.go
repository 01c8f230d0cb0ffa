package rules

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/prometheus/model/labels"
)

// Notification is one alert as it is sent: firing (EndsAt in the
// future, when it expires unless sent again) or resolved (EndsAt when
// it stopped).
type Notification struct {
	Labels       labels.Labels
	Annotations  labels.Labels
	StartsAt     time.Time
	EndsAt       time.Time
	GeneratorURL string
	// Resolved is set when the alert has stopped.
	Resolved bool
}

// Receiver kinds.
const (
	// KindAlertmanager posts to Alertmanager's API v2
	// (POST <url>/api/v2/alerts, a JSON array of alerts).
	KindAlertmanager = "alertmanager"
	// KindWebhook posts {"status","alerts":[...]} to the URL as it is.
	KindWebhook = "webhook"
)

// Defaults of NotifierConfig.
const (
	DefaultQueueCapacity = 10000
	DefaultMaxBatch      = 64
	DefaultSendTimeout   = 10 * time.Second
	// sendAttempts is how often a batch is tried before it is dropped.
	sendAttempts = 3
)

// Receiver is one destination of notifications.
type Receiver struct {
	Kind string
	URL  string
}

// NotifierConfig configures a Notifier.
type NotifierConfig struct {
	Receivers []Receiver
	// QueueCapacity bounds each receiver's queue of alerts; when it is
	// full the oldest are dropped (and counted). Default
	// DefaultQueueCapacity.
	QueueCapacity int
	// MaxBatch is the most alerts one request carries. Default
	// DefaultMaxBatch.
	MaxBatch int
	// Timeout bounds one request. Default DefaultSendTimeout.
	Timeout time.Duration
	Client  *http.Client
	Logger  *slog.Logger
}

// Notifier sends alerts to each receiver from its own bounded queue,
// so a receiver that is slow or down delays nothing else.
type Notifier struct {
	queues []*queue
	wg     sync.WaitGroup
	cancel context.CancelFunc
}

var _ Sender = (*Notifier)(nil)

// queue is one receiver's queue and its sender.
type queue struct {
	r      Receiver
	url    string
	cfg    NotifierConfig
	mu     sync.Mutex
	items  []Notification
	more   chan struct{}
	stats  QueueStats
	log    *slog.Logger
	client *http.Client
}

// QueueStats counts a receiver's alerts.
type QueueStats struct {
	Sent, Dropped, Failed int
}

// NewNotifier checks the receivers' URLs and starts one sender each;
// Close stops them.
func NewNotifier(cfg NotifierConfig) (*Notifier, error) {
	if cfg.QueueCapacity <= 0 {
		cfg.QueueCapacity = DefaultQueueCapacity
	}
	if cfg.MaxBatch <= 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultSendTimeout
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: cfg.Timeout}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	n := &Notifier{}
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	for _, r := range cfg.Receivers {
		u, err := url.Parse(r.URL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			cancel()
			return nil, fmt.Errorf("%s url %q: want http(s)://host[:port][/path]", r.Kind, r.URL)
		}
		target := r.URL
		switch r.Kind {
		case KindAlertmanager:
			target = strings.TrimSuffix(r.URL, "/") + "/api/v2/alerts"
		case KindWebhook:
		default:
			cancel()
			return nil, fmt.Errorf("receiver kind %q: want %s or %s", r.Kind, KindAlertmanager, KindWebhook)
		}
		q := &queue{r: r, url: target, cfg: cfg, more: make(chan struct{}, 1), client: cfg.Client,
			log: cfg.Logger.With("receiver", u.Redacted(), "kind", r.Kind)}
		n.queues = append(n.queues, q)
		n.wg.Go(func() { q.run(ctx) })
	}
	return n, nil
}

// Send queues alerts for every receiver; it never blocks.
func (n *Notifier) Send(alerts []Notification) {
	for _, q := range n.queues {
		q.push(alerts)
	}
}

// Stats returns each receiver's counts, in the order of the config.
func (n *Notifier) Stats() []QueueStats {
	out := make([]QueueStats, len(n.queues))
	for i, q := range n.queues {
		q.mu.Lock()
		out[i] = q.stats
		q.mu.Unlock()
	}
	return out
}

// Close stops the senders; alerts still queued are not sent.
func (n *Notifier) Close() {
	n.cancel()
	n.wg.Wait()
}

func (q *queue) push(alerts []Notification) {
	q.mu.Lock()
	q.items = append(q.items, alerts...)
	if over := len(q.items) - q.cfg.QueueCapacity; over > 0 {
		q.items = append(q.items[:0], q.items[over:]...)
		q.stats.Dropped += over
		q.log.Warn("alert queue full: oldest alerts dropped", "dropped", over, "capacity", q.cfg.QueueCapacity)
	}
	q.mu.Unlock()
	select {
	case q.more <- struct{}{}:
	default:
	}
}

func (q *queue) next() []Notification {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(len(q.items), q.cfg.MaxBatch)
	b := append([]Notification(nil), q.items[:n]...)
	q.items = append(q.items[:0], q.items[n:]...)
	return b
}

func (q *queue) run(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.more:
		}
		for b := q.next(); len(b) > 0; b = q.next() {
			err := q.sendWithRetry(ctx, b)
			q.mu.Lock()
			if err != nil {
				q.stats.Failed += len(b)
			} else {
				q.stats.Sent += len(b)
			}
			q.mu.Unlock()
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				q.log.Warn("alerts not delivered", "alerts", len(b), "err", err)
			}
		}
	}
}

func (q *queue) sendWithRetry(ctx context.Context, b []Notification) error {
	body, err := q.encode(b)
	if err != nil {
		return err
	}
	wait := 500 * time.Millisecond
	for i := 0; ; i++ {
		err = q.post(ctx, body)
		if err == nil || i == sendAttempts-1 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait *= 2
	}
}

func (q *queue) post(ctx context.Context, body []byte) error {
	ctx, cancel := context.WithTimeout(ctx, q.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, q.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := q.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

// amAlert is an alert in Alertmanager's API v2 (postableAlert).
type amAlert struct {
	Labels       map[string]string `json:"labels"`
	Annotations  map[string]string `json:"annotations,omitempty"`
	StartsAt     time.Time         `json:"startsAt,omitzero"`
	EndsAt       time.Time         `json:"endsAt,omitzero"`
	GeneratorURL string            `json:"generatorURL,omitempty"`
	// Status is set in webhook bodies only: firing or resolved.
	Status string `json:"status,omitempty"`
}

// WebhookBody is what a webhook receiver gets: the alerts of one batch,
// with the batch's status (resolved when every alert is).
type WebhookBody struct {
	Version string    `json:"version"`
	Status  string    `json:"status"`
	Alerts  []amAlert `json:"alerts"`
}

func (q *queue) encode(b []Notification) ([]byte, error) {
	out := make([]amAlert, len(b))
	status := "resolved"
	for i, n := range b {
		out[i] = amAlert{Labels: n.Labels.Map(), Annotations: n.Annotations.Map(), StartsAt: n.StartsAt, EndsAt: n.EndsAt,
			GeneratorURL: n.GeneratorURL}
		if q.r.Kind == KindWebhook {
			out[i].Status = "resolved"
			if !n.Resolved {
				out[i].Status, status = "firing", "firing"
			}
		}
	}
	switch q.r.Kind {
	case KindAlertmanager:
		return json.Marshal(out)
	case KindWebhook:
		return json.Marshal(WebhookBody{Version: "1", Status: status, Alerts: out})
	}
	return nil, errors.New("unknown receiver kind " + q.r.Kind)
}
