package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ErrStillRefused wraps the error of a reload of content that already
// failed to load: Watch reports such content once, not at every poll.
var ErrStillRefused = errors.New("auth file unchanged since it was refused")

// DefaultPollInterval is how often a Store looks for a changed file.
const DefaultPollInterval = 2 * time.Second

// Store holds the current Set of an auth file and reloads it when the
// file changes (polled, so edits, renames and Kubernetes' symlink swaps
// of mounted secrets are all seen) or when Reload is called (SIGHUP). A
// file that fails to load leaves the previous Set in force and is
// reported (by Watch, or by the caller of Reload); it is retried when it
// changes again.
type Store struct {
	path  string
	extra []Token
	log   *slog.Logger
	cur   atomic.Pointer[Set]

	mu       sync.Mutex // serializes reloads; guards sum, onChange
	sum      [sha256.Size]byte
	bad      [sha256.Size]byte // content that last failed to parse
	badErr   error             // why it failed
	onChange []func(*Set)
}

// Open loads the auth file at path; extra tokens are added to it on
// every load. A file that does not load is an error here (at start):
// the service must not run with credentials it cannot read.
func Open(path string, log *slog.Logger, extra ...Token) (*Store, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Store{path: path, extra: extra, log: log}
	if _, err := s.reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Static returns a Store that never reloads, holding f.
func Static(f *File, extra ...Token) *Store {
	s := &Store{log: slog.Default()}
	s.cur.Store(Compile(f, extra...))
	return s
}

// Current returns the Set in force.
func (s *Store) Current() *Set { return s.cur.Load() }

// OnChange registers fn to run after every successful reload that
// changed the file, with the new Set.
func (s *Store) OnChange(fn func(*Set)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onChange = append(s.onChange, fn)
}

// Reload loads the file now. It reports whether the content changed;
// on error the previous Set stays in force and the error is the
// caller's to report (it wraps ErrStillRefused when the content is the
// one refused last time). Reload itself logs nothing.
func (s *Store) Reload() (bool, error) {
	if s.path == "" {
		return false, nil
	}
	return s.reload()
}

func (s *Store) reload() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	data, err := os.ReadFile(s.path)
	if err != nil {
		return false, fmt.Errorf("auth file: %w", err)
	}
	sum := sha256.Sum256(data)
	if s.cur.Load() != nil && bytes.Equal(sum[:], s.sum[:]) {
		return false, nil
	}
	if s.cur.Load() != nil && bytes.Equal(sum[:], s.bad[:]) {
		return false, fmt.Errorf("%w: %w", ErrStillRefused, s.badErr)
	}
	f, err := Parse(data)
	if err != nil {
		s.bad, s.badErr = sum, fmt.Errorf("%s: %w", s.path, err)
		return false, s.badErr
	}
	set := Compile(f, s.extra...)
	s.sum = sum
	s.cur.Store(set)
	for _, fn := range s.onChange {
		fn(set)
	}
	return true, nil
}

// Watch reloads the file every interval until ctx is done, and logs
// each reload and each refused content (once). Use DefaultPollInterval
// when unsure.
func (s *Store) Watch(ctx context.Context, interval time.Duration) {
	if s.path == "" {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			changed, err := s.Reload()
			switch {
			case errors.Is(err, ErrStillRefused): // logged when first seen
			case err != nil:
				s.log.Error("auth file not reloaded; the previous credentials stay in force", "path", s.path, "err", err)
			case changed:
				s.log.Info("auth file reloaded", "path", s.path)
			}
		}
	}
}

// Token returns the principal of an API token secret in the current
// Set.
func (s *Store) Token(secret string) (*Principal, bool) { return s.Current().Token(secret) }

// TokenNamed returns the principal of the token named name in the
// current set.
func (s *Store) TokenNamed(name string) (*Principal, bool) { return s.Current().TokenNamed(name) }

// Device reports whether secret is device id's secret in the current
// Set.
func (s *Store) Device(id, secret string) bool { return s.Current().Device(id, secret) }
