package main

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/telemetryd/telemetryd/api/auth"
)

// internalUser is the user name of the service's own connection to the
// embedded server. It is not a valid device ID, so no device entry can
// take it; its password is random per process and never written down.
const internalUser = "$telemetryd"

// serviceUser reports whether user is one of the service's own
// connections (never a device, never subject to the auth file).
func serviceUser(user string) bool { return user == internalUser || user == mqttAdminUser }

// Reasons of telemetry.auth.denied.
const (
	deniedCredentials = "credentials" // wrong or unknown user/secret
	deniedPublish     = "publish"     // publish outside the device's subject
	deniedSubscribe   = "subscribe"   // subscribe outside the inbox
)

// deviceAuth is the embedded NATS server's CustomClientAuthentication
// (NATS and MQTT clients both pass through it). Devices log in as user
// = device ID with their secret and may publish only to
// <prefix>.<device> (MQTT topic <prefix>/<device>) and subscribe only
// to reply inboxes; nothing else, so no device can reach $JS.API.
type deviceAuth struct {
	creds    *auth.Store
	prefix   string
	internal string // the internal user's password
	denied   *deniedReporter
}

// Check authenticates one client connection.
func (a *deviceAuth) Check(c server.ClientAuthentication) bool {
	o := c.GetOpts()
	if o.Username == internalUser {
		if !equalSecret(o.Password, a.internal) {
			a.denied.report(context.Background(), deniedCredentials, "nats login refused", "user", o.Username, "remote", addrOf(c))
			return false
		}
		c.RegisterUser(&server.User{Username: internalUser}) // no permissions: everything
		return true
	}
	if o.Username == "" || !a.creds.Device(o.Username, o.Password) {
		a.denied.report(context.Background(), deniedCredentials, "nats login refused", "user", o.Username, "remote", addrOf(c))
		return false
	}
	c.RegisterUser(&server.User{Username: o.Username,
		Permissions: devicePermissions(a.prefix, o.Username, a.creds.Current().PublishAs(o.Username))})
	return true
}

// devicePermissions lets a device publish its own readings and receive
// replies (JetStream publish acks) in the default inbox namespace. The
// service's connection uses its own inbox prefix, so devices never see
// what the ingester consumes.
// A gateway's credential may publish for the devices of publishAs too
// ("*" is every device: the subject wildcard <prefix>.*).
func devicePermissions(prefix, device string, publishAs []string) *server.Permissions {
	allow := []string{prefix + "." + device}
	for _, id := range publishAs {
		allow = append(allow, prefix+"."+id)
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

// serviceInboxPrefix is the inbox prefix of the service's connection;
// devices may not subscribe to it.
const serviceInboxPrefix = "_TELEMETRYD_INBOX"

// kickRemovedDevices disconnects the clients logged in as a device that
// is no longer in set (removed from the auth file); every other
// connection stays, the service's own above all (serviceUser).
func kickRemovedDevices(ns *server.Server, set *auth.Set, log *slog.Logger) {
	for offset := 0; ; {
		cz, err := ns.Connz(&server.ConnzOptions{Username: true, Offset: offset, Limit: 1024})
		if err != nil {
			log.Warn("cannot list nats connections after an auth reload", "error", err)
			return
		}
		for _, ci := range cz.Conns {
			if ci.AuthorizedUser == "" || serviceUser(ci.AuthorizedUser) || set.HasDevice(ci.AuthorizedUser) {
				continue
			}
			if err := ns.DisconnectClientByID(ci.Cid); err == nil {
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
	for _, r := range []string{deniedCredentials, deniedPublish, deniedSubscribe} {
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

// violation recognises the embedded server's permission-violation log
// lines ("... - Publish Violation - Subject ...") and reports them.
func (d *deniedReporter) violation(line string) bool {
	var reason string
	switch {
	case strings.Contains(line, "Publish Violation"):
		reason = deniedPublish
	case strings.Contains(line, "Subscription Violation"):
		reason = deniedSubscribe
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
