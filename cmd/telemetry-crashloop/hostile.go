package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/api/auth"
)

// A -hostile run gives the service an auth file with these entries: a
// gateway credential the loop publishes its devices' readings with, a
// device of the hostile client, which may publish only on its own
// subject, a read token for the final check, and a device whose secret
// the hostile client replaces every second (a harmless change that
// makes the service reload the file).
const (
	loopGateway   = "crashloop-gw"
	hostileDevice = "hostile-1"
	churnDevice   = "hostile-churn"
	readTokenName = "crashloop-read"
	// hostileStreamMaxBytes bounds the TELEMETRY stream in a -hostile
	// run, so that the flood fills it many times over.
	hostileStreamMaxBytes = "64MiB"
)

// Knobs of the hostile client.
const (
	copyAhead      = 2000                  // messages ahead of the loop whose IDs are taken
	copyNth        = 2                     // every copyNth message's ID is taken, so losses of other causes show too
	copyEvery      = 20 * time.Millisecond // how often the next IDs are taken
	floodMax       = 6 << 20               // largest flood payload (capped by the server's max payload)
	floodMin       = 1 << 20               // smallest flood payload
	floodInFlight  = 2                     // flood publishes waiting for their ack at once
	refusedBackoff = 50 * time.Millisecond // wait after a refused publish
	floodAckWait   = 2 * time.Second       // a flood publish unacked this long counts as refused
	authEvery      = time.Second           // auth file rewrite (and SIGHUP) interval
)

// credentials are the secrets of a -hostile run's auth file.
type credentials struct {
	file          string
	loopSecret    string
	hostileSecret string
	readToken     string
}

// writeCredentials creates the auth file in dir: the loop's gateway may
// publish for devices, the hostile device only for itself.
func writeCredentials(dir string, devices []string) (*credentials, error) {
	c := &credentials{file: filepath.Join(dir, "auth.json")}
	secrets := make([]string, 4)
	for i := range secrets {
		s, err := auth.NewSecret()
		if err != nil {
			return nil, err
		}
		secrets[i] = s
	}
	c.loopSecret, c.hostileSecret, c.readToken = secrets[0], secrets[1], secrets[2]
	f := &auth.File{
		Devices: []auth.Device{
			{ID: loopGateway, Secret: auth.HashSecret(c.loopSecret), PublishAs: devices},
			{ID: hostileDevice, Secret: auth.HashSecret(c.hostileSecret)},
			{ID: churnDevice, Secret: auth.HashSecret(secrets[3])},
		},
		Tokens: []auth.Token{{Name: readTokenName, Secret: auth.HashSecret(c.readToken), Scopes: []auth.Scope{auth.ScopeRead}}},
	}
	if err := auth.Save(c.file, f); err != nil {
		return nil, fmt.Errorf("write auth file: %w", err)
	}
	return c, nil
}

// hostileService writes the auth file of a -hostile run into dir and
// adds the service flags of such a run to cfg.Args.
func hostileService(cfg *Config, dir string) (*credentials, error) {
	devices := []string{probeDevice}
	for d := range cfg.Devices {
		devices = append(devices, deviceName(d))
	}
	creds, err := writeCredentials(dir, devices)
	if err != nil {
		return nil, err
	}
	cfg.Args = append(slices.Clip(cfg.Args), "-auth-file", creds.file, "-stream-max-bytes", hostileStreamMaxBytes,
		"-http-rate", "0") // the check's reads are not under test
	return creds, nil
}

// HostileCounts is what the hostile client did. Its refusals and
// disconnects are expected, not failures of the run.
type HostileCounts struct {
	CopiesSent    atomic.Int64 // publishes carrying a Nats-Msg-Id of one of the loop's messages
	CopiesNew     atomic.Int64 // of those, acked as new: the loop's message with that ID came later
	CopiesDup     atomic.Int64 // acked as duplicates: the loop's message was there first
	CopiesRefused atomic.Int64 // refused or unanswered
	FloodAcked    atomic.Int64 // invalid payloads the stream took
	FloodBytes    atomic.Int64 // their bytes
	FloodRefused  atomic.Int64 // refused or unanswered (then sent again)
	AuthRewrites  atomic.Int64 // auth file rewrites
	AuthReloads   atomic.Int64 // SIGHUPs sent right after a rewrite (the service was up)
	AuthErrors    atomic.Int64 // rewrites that failed
	Disconnects   atomic.Int64 // the hostile client's connection lost
}

func (h *HostileCounts) String() string {
	return fmt.Sprintf("copied_ids=%d copies_new=%d copies_duplicate=%d copies_refused=%d "+
		"flood_acked=%d flood_mib=%d flood_refused=%d auth_rewrites=%d auth_sighups=%d auth_errors=%d disconnects=%d",
		h.CopiesSent.Load(), h.CopiesNew.Load(), h.CopiesDup.Load(), h.CopiesRefused.Load(),
		h.FloodAcked.Load(), h.FloodBytes.Load()>>20, h.FloodRefused.Load(),
		h.AuthRewrites.Load(), h.AuthReloads.Load(), h.AuthErrors.Load(), h.Disconnects.Load())
}

// hostile is a second client with a credential of its own. While the
// loop publishes it
//   - publishes on its own subject with the Nats-Msg-Id of the loop's
//     next messages (the IDs are predictable), before the loop sends
//     them, so that a service whose duplicate window is shared by every
//     client acks the loop's messages as duplicates without storing
//     them;
//   - floods the bounded stream with large invalid payloads as fast as
//     they are acked, retrying when refused, so that a stream that
//     discards old messages when full drops acked, unconsumed ones;
//   - rewrites the auth file every second (a new secret for an unrelated
//     device) and sends SIGHUP, so the service reloads it.
type hostile struct {
	svc    *service
	pub    *publisher
	creds  *credentials
	counts *HostileCounts
	seed   int64
	log    *slog.Logger
}

// run starts the hostile client. stopTraffic ends its publishing (the
// ID copies and the flood) and waits for it; stop ends the rest (the
// auth file rewrites) too.
func (h *hostile) run(ctx context.Context) (stopTraffic, stop func(), err error) {
	nc, err := nats.Connect("nats://"+h.svc.natsAddr, nats.UserInfo(hostileDevice, h.creds.hostileSecret),
		nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(*nats.Conn, error) { h.counts.Disconnects.Add(1) }),
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // permission errors are its own doing
	if err != nil {
		return nil, nil, fmt.Errorf("hostile client: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(5*time.Second),
		jetstream.WithPublishAsyncMaxPending(256))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	authCtx, stopAuth := context.WithCancel(ctx)
	trafficCtx, stopPublishing := context.WithCancel(ctx)
	var traffic, churn sync.WaitGroup
	traffic.Add(1 + floodInFlight)
	go func() { defer traffic.Done(); h.copyIDs(trafficCtx, js) }()
	for i := range floodInFlight {
		go func() { defer traffic.Done(); h.flood(trafficCtx, js, int(nc.MaxPayload()), uint64(i)) }()
	}
	churn.Add(1)
	go func() { defer churn.Done(); h.churnAuth(authCtx) }()
	stopTraffic = func() { stopPublishing(); traffic.Wait(); nc.Close() }
	stop = func() { stopTraffic(); stopAuth(); churn.Wait() }
	return stopTraffic, stop, nil
}

// copyIDs publishes, on the hostile device's own subject, messages with
// the IDs of every copyNth of the loop's next copyAhead messages, each
// ID once.
func (h *hostile) copyIDs(ctx context.Context, js jetstream.JetStream) {
	subject := "telemetry." + hostileDevice
	total := h.pub.messages()
	copied := 0
	t := time.NewTicker(copyEvery)
	defer t.Stop()
	for {
		next := int(h.pub.next.Load())
		for m := max(copied, next); m < min(next+copyAhead, total); m++ {
			if m%copyNth != 0 {
				copied = m + 1
				continue
			}
			msg := nats.NewMsg(subject)
			msg.Data = []byte(`{"copied":` + msgID(m)) // not JSON: it stores nothing
			msg.Header.Set(jetstream.MsgIDHeader, msgID(m))
			fut, err := js.PublishMsgAsync(msg)
			if err != nil {
				h.counts.CopiesRefused.Add(1)
				break // from here again on the next tick
			}
			h.counts.CopiesSent.Add(1)
			copied = m + 1
			go h.tallyCopy(ctx, fut)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (h *hostile) tallyCopy(ctx context.Context, fut jetstream.PubAckFuture) {
	select {
	case ack := <-fut.Ok():
		if ack.Duplicate {
			h.counts.CopiesDup.Add(1)
		} else {
			h.counts.CopiesNew.Add(1)
		}
	case <-fut.Err():
		h.counts.CopiesRefused.Add(1)
	case <-ctx.Done():
	}
}

// flood publishes invalid payloads of floodMin..floodMax bytes (at most
// the server's max payload) as fast as they are acked; a refused one
// is sent again after refusedBackoff.
func (h *hostile) flood(ctx context.Context, js jetstream.JetStream, maxPayload int, stream uint64) {
	hi := min(floodMax, maxPayload-4096) // room for headers
	lo := min(floodMin, hi/2)
	junk := bytes.Repeat([]byte("{not json "), hi/10+1)[:hi]
	rng := rand.New(rand.NewPCG(uint64(h.seed), 0xf100d+stream))
	subject := "telemetry." + hostileDevice
	for ctx.Err() == nil {
		size := lo + rng.IntN(hi-lo+1)
		for ctx.Err() == nil {
			pctx, cancel := context.WithTimeout(ctx, floodAckWait)
			_, err := js.Publish(pctx, subject, junk[:size])
			cancel()
			if err == nil {
				h.counts.FloodAcked.Add(1)
				h.counts.FloodBytes.Add(int64(size))
				break
			}
			if ctx.Err() != nil {
				return
			}
			h.counts.FloodRefused.Add(1)
			sleep(ctx, refusedBackoff)
		}
	}
}

// churnAuth gives churnDevice a new secret every authEvery and sends
// SIGHUP when the service is up, so that it reloads the file each time.
func (h *hostile) churnAuth(ctx context.Context) {
	t := time.NewTicker(authEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := rewriteChurn(h.creds.file); err != nil {
			h.counts.AuthErrors.Add(1)
			h.log.Warn("auth file rewrite failed", "err", err)
			continue
		}
		h.counts.AuthRewrites.Add(1)
		if h.svc.hup() {
			h.counts.AuthReloads.Add(1)
		}
	}
}

// rewriteChurn saves the auth file with a new secret for churnDevice.
func rewriteChurn(path string) error {
	f, err := auth.Load(path)
	if err != nil {
		return err
	}
	secret, err := auth.NewSecret()
	if err != nil {
		return err
	}
	d := auth.Device{ID: churnDevice, Secret: auth.HashSecret(secret)}
	if i := slices.IndexFunc(f.Devices, func(d auth.Device) bool { return d.ID == churnDevice }); i >= 0 {
		f.Devices[i] = d
	} else {
		f.Devices = append(f.Devices, d)
	}
	return auth.Save(path, f)
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
