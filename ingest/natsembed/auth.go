package natsembed

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"strconv"
	"strings"
	"sync"
	"time"

	"log/slog"

	"github.com/nats-io/nats-server/v2/server"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/ingest/partition"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// The service's own users and inbox.
const (
	// InternalUser is the user name of the service's own connection. It
	// is not a valid device ID, so no device entry can take it; its
	// password is random per process and never written down.
	InternalUser = "$telemetryd"
	// MQTTAdminUser is the service's connection to the MQTT account
	// (the QoS 0 forwarder).
	MQTTAdminUser = "$telemetryd-mqtt"
	// ServiceInboxPrefix is the inbox prefix of the service's
	// connections; devices may not subscribe to it.
	ServiceInboxPrefix = "_TELEMETRYD_INBOX"
)

// serviceUser reports whether user is one of the service's own
// connections (never a device, never subject to the credentials).
func serviceUser(user string) bool { return user == InternalUser || user == MQTTAdminUser }

// Reasons of telemetry.auth.denied.
const (
	DeniedCredentials = "credentials" // wrong or unknown user/secret
	DeniedPublish     = "publish"     // publish outside the device's subject
	DeniedSubscribe   = "subscribe"   // subscribe outside the inbox
)

// deviceAuth is the server's CustomClientAuthentication (NATS and MQTT
// clients both pass through it). Devices log in as user = device ID
// with their secret and may publish only to <prefix>.<device> (MQTT
// topic <prefix>/<device>) and subscribe only to reply inboxes;
// nothing else, so no device can reach $JS.API.
type deviceAuth struct {
	devices func() Devices
	prefix  string
	// partitions: the server maps <prefix>.<device> to
	// <prefix>.<partition>.<device> before it checks a publish, so the
	// permissions name that subject too (0: no mapping).
	partitions int
	internal   string // the internal user's password
	denied     *deniedReporter
}

// Check authenticates one client connection.
func (a *deviceAuth) Check(c server.ClientAuthentication) bool {
	o := c.GetOpts()
	if o.Username == InternalUser {
		if !equalSecret(o.Password, a.internal) {
			a.denied.report(context.Background(), DeniedCredentials, "nats login refused", "user", o.Username, "remote", addrOf(c))
			return false
		}
		c.RegisterUser(&server.User{Username: InternalUser}) // no permissions: everything
		return true
	}
	devices := a.devices()
	if o.Username == "" || !devices.Device(o.Username, o.Password) {
		a.denied.report(context.Background(), DeniedCredentials, "nats login refused", "user", o.Username, "remote", addrOf(c))
		return false
	}
	c.RegisterUser(&server.User{Username: o.Username,
		Permissions: devicePermissions(a.prefix, a.partitions, o.Username, devices.PublishAs(o.Username))})
	return true
}

// devicePermissions lets a device publish its own readings and receive
// replies (JetStream publish acks) in the default inbox namespace. The
// service's connection uses its own inbox prefix, so devices never see
// what the ingester consumes.
// A gateway's credential may publish for the devices of publishAs too
// ("*" is every device: the subject wildcard <prefix>.*). With a
// stream per partition (partitions > 0) the server checks the subject
// its mapping made, <prefix>.<partition>.<device>, which is allowed too
// (<prefix>.*.* for "*").
func devicePermissions(prefix string, partitions int, device string, publishAs []string) *server.Permissions {
	subjects := topology.For(prefix)
	var allow []string
	for _, id := range append([]string{device}, publishAs...) {
		allow = append(allow, subjects.Device(id))
		switch {
		case partitions == 0:
		case id == "*":
			allow = append(allow, prefix+".*.*")
		default:
			allow = append(allow, prefix+"."+strconv.Itoa(partition.Of(partitions, id))+"."+id)
		}
	}
	return &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: allow},
		Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
	}
}

func addrOf(c server.ClientAuthentication) string {
	if a := c.RemoteAddress(); a != nil {
		return a.String()
	}
	return ""
}

// DisconnectRemovedDevices disconnects the clients logged in as a
// device for which has is false (removed from the credentials); every
// other connection stays, the service's own above all.
func (s *Server) DisconnectRemovedDevices(has func(device string) bool) {
	log := s.log.With("component", "auth")
	for offset := 0; ; {
		cz, err := s.ns.Connz(&server.ConnzOptions{Username: true, Offset: offset, Limit: 1024})
		if err != nil {
			log.Warn("cannot list nats connections after an auth reload", "err", err)
			return
		}
		for _, ci := range cz.Conns {
			if ci.AuthorizedUser == "" || serviceUser(ci.AuthorizedUser) || has(ci.AuthorizedUser) {
				continue
			}
			if err := s.ns.DisconnectClientByID(ci.Cid); err == nil {
				log.Info("device disconnected: no longer in the auth file", "device", ci.AuthorizedUser, "cid", ci.Cid)
			}
		}
		if len(cz.Conns) < 1024 {
			return
		}
		offset += len(cz.Conns)
	}
}

// deniedReporter counts refused logins and permission violations in
// telemetry.auth.denied and logs them sampled: the first of each reason
// in an interval with its detail, then one line per interval with the
// count, so a flood cannot flood the log.
type deniedReporter struct {
	counter  metric.Int64Counter
	log      *slog.Logger
	interval time.Duration

	mu      sync.Mutex
	windows map[string]*sampleWindow
}

type sampleWindow struct {
	start      time.Time
	suppressed int64
}

func newDeniedReporter(meter metric.Meter, log *slog.Logger, interval time.Duration) (*deniedReporter, error) {
	c, err := meter.Int64Counter("telemetry.auth.denied", metric.WithUnit("{attempt}"),
		metric.WithDescription("Logins refused and publishes or subscriptions denied, by reason."))
	if err != nil {
		return nil, err
	}
	// Every reason is exported from the start (at 0), so alerts on a
	// rate see the series before the first denial.
	for _, r := range []string{DeniedCredentials, DeniedPublish, DeniedSubscribe} {
		c.Add(context.Background(), 0, metric.WithAttributes(attribute.String("reason", r)))
	}
	return &deniedReporter{counter: c, log: log, interval: interval, windows: map[string]*sampleWindow{}}, nil
}

func (d *deniedReporter) report(ctx context.Context, reason, msg string, args ...any) {
	d.counter.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", reason)))
	now := time.Now()
	d.mu.Lock()
	w := d.windows[reason]
	if w != nil && now.Sub(w.start) < d.interval {
		w.suppressed++
		d.mu.Unlock()
		return
	}
	suppressed := int64(0)
	if w != nil {
		suppressed = w.suppressed
	}
	d.windows[reason] = &sampleWindow{start: now}
	d.mu.Unlock()
	args = append(args, "reason", reason)
	if suppressed > 0 {
		args = append(args, "more_since_last_line", suppressed)
	}
	d.log.Warn(msg, args...)
}

// violation recognises the server's permission-violation log lines
// ("... - Publish Violation - Subject ...") and reports them.
func (d *deniedReporter) violation(line string) bool {
	var reason string
	switch {
	case strings.Contains(line, "Publish Violation"):
		reason = DeniedPublish
	case strings.Contains(line, "Subscription Violation"):
		reason = DeniedSubscribe
	default:
		return false
	}
	d.report(context.Background(), reason, "nats permission violation", "detail", line)
	return true
}

// equalSecret compares two secrets in constant time (of their hashes,
// so the length of either is not revealed).
func equalSecret(got, want string) bool {
	g, w := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}
