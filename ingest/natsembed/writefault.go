package natsembed

import (
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Recovery from a full disk. When a stream's store fails a write (no
// space left on device), nats-server keeps the error: the message
// block, the file store and the stream each remember it
// (msgBlock.werr, fileStore.werr, stream.werr) and every later write
// fails with it, without a reply to the publisher, so publishes time
// out long after space came back. Nothing in the server clears it; a
// restart does, because it opens the stores anew.
//
// The server logs such a failure ("Critical write error", "critical
// write error"): the embedded server notes it as a write fault of the
// account the stream belongs to ($MQTT_* streams are the MQTT
// account's, every other one the service's). While a fault is noted,
// WriteFault reports it (readiness fails with it), and every
// faultCheckEvery the server looks at the free space of its store dir:
// once at least faultRecoverFree is available, it turns JetStream off
// and on again, which stops every stream and consumer (nothing is
// deleted) and opens them again from disk, with fresh stores; the
// service's clients set their consumers up again by themselves. What the streams held is kept; a message whose write
// failed was never acked to its publisher.

// Write fault timing and the free space that ends one.
const (
	faultCheckEvery  = time.Second
	faultRecoverFree = 32 << 20
)

// writeFaults are the accounts whose streams failed a write.
type writeFaults struct {
	mu       sync.Mutex
	accounts map[string]string // account name -> the first error line
	since    time.Time
}

// noteLog notes a write fault when msg, a server error line, reports one.
func (w *writeFaults) noteLog(msg string) {
	if !strings.Contains(strings.ToLower(msg), "critical write error") {
		return
	}
	acc := server.DEFAULT_GLOBAL_ACCOUNT
	if strings.Contains(msg, "$MQTT_") {
		acc = MQTTAccount
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.accounts == nil {
		w.accounts = make(map[string]string)
	}
	if len(w.accounts) == 0 {
		w.since = time.Now()
	}
	if _, ok := w.accounts[acc]; !ok {
		w.accounts[acc] = msg
	}
}

// take returns the faulted accounts and forgets them.
func (w *writeFaults) take() map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	a := w.accounts
	w.accounts = nil
	return a
}

// err is the fault as an error, nil when none is noted.
func (w *writeFaults) err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for acc, msg := range w.accounts {
		return fmt.Errorf("jetstream cannot write (account %s, since %s; it recovers by itself once %d MiB are free): %s",
			acc, w.since.UTC().Format(time.RFC3339), faultRecoverFree>>20, msg)
	}
	return nil
}

// WriteFault reports a JetStream write failure not yet recovered from
// (see writefault.go), or nil.
func (s *Server) WriteFault() error {
	if s.faults == nil {
		return nil
	}
	return s.faults.err()
}

// watchWriteFaults recovers from write faults until stop is closed.
func (s *Server) watchWriteFaults(stop <-chan struct{}) {
	t := time.NewTicker(faultCheckEvery)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		if s.faults.err() == nil || freeBytes(s.cfg.StoreDir) < faultRecoverFree {
			continue
		}
		since := s.faults.since
		faulted := s.faults.take()
		if err := s.reopenJetStream(); err != nil {
			for _, msg := range faulted {
				s.faults.noteLog(msg) // try again at the next check
			}
			s.log.Error("jetstream: reopening the streams after a write error failed; trying again", "err", err)
			continue
		}
		s.log.Info("jetstream: space is back; streams reopened after a write error",
			"faulted_for", time.Since(since).Round(time.Millisecond).String())
	}
}

// reopenJetStream turns JetStream off and on again, as a restart of the
// server would: every stream and consumer is stopped (nothing is
// deleted) and opened again from disk, and the server's storage limit
// is measured anew. (Turning it off and on per account leaves the
// stopped streams' storage reserved, and the second time the account
// is refused as out of storage.)
func (s *Server) reopenJetStream() error {
	if s.ns.JetStreamEnabled() {
		if err := s.ns.DisableJetStream(); err != nil {
			return fmt.Errorf("disable: %w", err)
		}
	}
	cfg := s.jsConfig
	if err := s.ns.EnableJetStream(&cfg); err != nil {
		return fmt.Errorf("enable: %w", err)
	}
	return nil
}

// freeBytes is what the file system of dir has available (0 when it
// cannot be told).
func freeBytes(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0
	}
	return int64(st.Bavail) * int64(st.Bsize)
}
