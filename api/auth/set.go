package auth

import (
	"context"
	"crypto/sha256"
	"path"
	"slices"
)

// Principal is what an authenticated token may do. A nil *Principal
// means no authentication is configured: everything is allowed.
type Principal struct {
	// Name is the token's name, for logs and rate limiting.
	Name     string
	scopes   []Scope
	patterns []string // nil: every device
}

// NewPrincipal returns a principal with scopes over the devices that
// match patterns (none: every device). Patterns must be valid.
func NewPrincipal(name string, scopes []Scope, patterns []string) *Principal {
	return &Principal{Name: name, scopes: slices.Clone(scopes), patterns: slices.Clone(patterns)}
}

// Has reports whether p grants scope s.
func (p *Principal) Has(s Scope) bool {
	return p == nil || slices.Contains(p.scopes, s)
}

// AllDevices reports whether p covers every device.
func (p *Principal) AllDevices() bool { return p == nil || len(p.patterns) == 0 }

// DeviceVisible reports whether device id matches one of p's patterns.
func (p *Principal) DeviceVisible(id string) bool {
	if p.AllDevices() {
		return true
	}
	for _, pat := range p.patterns {
		if ok, _ := path.Match(pat, id); ok {
			return true
		}
	}
	return false
}

type principalKey struct{}

// WithPrincipal returns ctx carrying p.
func WithPrincipal(ctx context.Context, p *Principal) context.Context {
	return context.WithValue(ctx, principalKey{}, p)
}

// FromContext returns the principal of the request, nil when the
// request was not authenticated because no auth is configured.
func FromContext(ctx context.Context) *Principal {
	p, _ := ctx.Value(principalKey{}).(*Principal)
	return p
}

// Visible reports whether the request of ctx may see device id. Every
// handler that lists or returns devices (device lists, PromQL series
// and label values, aggregates) asks it; without auth every device is
// visible.
func Visible(ctx context.Context, id string) bool {
	return FromContext(ctx).DeviceVisible(id)
}

// Set is an immutable, indexed auth file: what the service checks
// credentials against. The zero of *Set (nil) knows no credential.
type Set struct {
	devices  map[string][sha256.Size]byte
	gateways map[string][]string // device ID -> publishAs
	tokens   map[[sha256.Size]byte]*Principal
	byName   map[string]*Principal
}

// Compile indexes a validated file. extra tokens are added as given.
func Compile(f *File, extra ...Token) *Set {
	s := &Set{devices: map[string][sha256.Size]byte{}, gateways: map[string][]string{},
		tokens: map[[sha256.Size]byte]*Principal{}, byName: map[string]*Principal{}}
	if f == nil {
		f = &File{}
	}
	for _, d := range f.Devices {
		if h, err := parseHash(d.Secret); err == nil {
			s.devices[d.ID] = h
			if len(d.PublishAs) > 0 {
				s.gateways[d.ID] = slices.Clone(d.PublishAs)
			}
		}
	}
	for _, t := range append(slices.Clone(f.Tokens), extra...) {
		if h, err := parseHash(t.Secret); err == nil {
			p := NewPrincipal(t.Name, t.Scopes, t.Devices)
			s.tokens[h] = p
			s.byName[t.Name] = p
		}
	}
	return s
}

// Device reports whether secret is device id's secret.
func (s *Set) Device(id, secret string) bool {
	if s == nil {
		return false
	}
	want, ok := s.devices[id]
	got := sha256.Sum256([]byte(secret))
	if !ok {
		// Same work either way, so timing does not tell known IDs.
		equalHash(got, got)
		return false
	}
	return equalHash(got, want)
}

// HasDevice reports whether id has a credential.
func (s *Set) HasDevice(id string) bool {
	if s == nil {
		return false
	}
	_, ok := s.devices[id]
	return ok
}

// Token returns the principal of an API token secret. The lookup is
// by the secret's SHA-256, so its timing tells nothing of the secret.
func (s *Set) Token(secret string) (*Principal, bool) {
	if s == nil || secret == "" {
		return nil, false
	}
	p, ok := s.tokens[sha256.Sum256([]byte(secret))]
	return p, ok
}

// TokenNamed returns the principal of the token named name: what a
// cluster node applies to a call it answers for another node's client.
func (s *Set) TokenNamed(name string) (*Principal, bool) {
	if s == nil {
		return nil, false
	}
	p, ok := s.byName[name]
	return p, ok
}

// PublishAs returns the other devices credential id may publish for
// ("*": every device); nil for a plain device.
func (s *Set) PublishAs(id string) []string {
	if s == nil {
		return nil
	}
	return s.gateways[id]
}
