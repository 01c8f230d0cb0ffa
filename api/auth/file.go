// Package auth holds the credentials of a telemetryd installation
// (SECURITY.md): the auth file of device secrets and scoped API tokens,
// its loader and validation, secret generation and hashing, and the
// request-scoped principal that HTTP handlers ask whether a device is
// visible.
//
// Secrets are never stored: the file holds "sha256:<hex>" of each, and
// a presented secret is hashed and compared in constant time.
package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
)

// Scope is a right a token grants on the HTTP API.
type Scope string

// The scopes that SECURITY.md describes.
const (
	ScopeRead    Scope = "read"    // query readings, devices, tables, PromQL, the UI
	ScopeWrite   Scope = "write"   // line-protocol writes
	ScopeAdmin   Scope = "admin"   // drop tables, run retention
	ScopeMetrics Scope = "metrics" // GET /metrics
)

// Scopes lists every valid scope.
var Scopes = []Scope{ScopeRead, ScopeWrite, ScopeAdmin, ScopeMetrics}

// Limits of the auth file; past them it is refused, never truncated.
const (
	// MaxFileBytes bounds the auth file (a fleet of ~100k devices fits).
	MaxFileBytes = 64 << 20
	// MaxPatterns bounds the device patterns of one token.
	MaxPatterns = 256
	// MaxPatternLen bounds one device pattern.
	MaxPatternLen = 128
	// SecretBytes is the entropy of a generated secret (256 bits).
	SecretBytes = 32
	// MinSecretLen is the shortest secret accepted where one is given
	// by hand (e.g. -cluster-token).
	MinSecretLen = 16
)

const hashPrefix = "sha256:"

// Device is one device credential: it logs in to NATS and MQTT as user
// ID with its secret and may publish only as itself.
type Device struct {
	ID     string `json:"id"`
	Secret string `json:"secret"` // "sha256:<hex>"
	// PublishAs makes the credential a gateway's: it may also publish
	// the readings of these device IDs, or of every device with "*".
	PublishAs []string `json:"publishAs,omitempty"`
}

// Token is one HTTP API token.
type Token struct {
	Name   string  `json:"name"`
	Secret string  `json:"secret"` // "sha256:<hex>"
	Scopes []Scope `json:"scopes"`
	// Devices are shell glob patterns on the device ID; none means
	// every device.
	Devices []string `json:"devices,omitempty"`
}

// File is the content of an auth file.
type File struct {
	Devices []Device `json:"devices"`
	Tokens  []Token  `json:"tokens"`
}

var tokenNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// HashSecret returns the stored form of a secret: "sha256:<hex>".
func HashSecret(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// NewSecret returns a random secret of SecretBytes bytes, URL-safe
// base64 without padding.
func NewSecret() (string, error) {
	b := make([]byte, SecretBytes)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate secret: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// parseHash decodes "sha256:<64 hex>".
func parseHash(s string) ([sha256.Size]byte, error) {
	var h [sha256.Size]byte
	hexPart, ok := strings.CutPrefix(s, hashPrefix)
	if !ok {
		return h, errors.New(`must be "sha256:<64 hex digits>" (telemetryd auth generates it; never the secret itself)`)
	}
	if len(hexPart) != 2*sha256.Size {
		return h, fmt.Errorf("has %d hex digits after sha256:, want %d", len(hexPart), 2*sha256.Size)
	}
	if _, err := hex.Decode(h[:], []byte(hexPart)); err != nil {
		return h, errors.New("is not hexadecimal after the sha256 prefix")
	}
	return h, nil
}

// ValidatePattern checks a device pattern: a shell glob (path.Match
// syntax) of at most MaxPatternLen bytes.
func ValidatePattern(p string) error {
	if p == "" || len(p) > MaxPatternLen {
		return fmt.Errorf("device pattern %q must have 1 to %d characters", p, MaxPatternLen)
	}
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("device pattern %q is not a valid glob: %w", p, err)
	}
	return nil
}

// Parse decodes and validates an auth file. Unknown fields, duplicate
// IDs, names or secrets, malformed hashes, scopes and patterns are
// errors naming the entry.
func Parse(data []byte) (*File, error) {
	if len(data) > MaxFileBytes {
		return nil, fmt.Errorf("auth file is %d bytes, more than the limit of %d", len(data), MaxFileBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("auth file: unexpected data after the JSON object")
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

// Validate checks every entry of f.
func (f *File) Validate() error {
	var errs []error
	ids := map[string]bool{}
	hashes := map[string]string{}
	seen := func(h, who string) {
		if prev, dup := hashes[h]; dup {
			errs = append(errs, fmt.Errorf("%s has the same secret as %s; every credential needs its own", who, prev))
		}
		hashes[h] = who
	}
	for i, d := range f.Devices {
		who := fmt.Sprintf("devices[%d] (%q)", i, d.ID)
		if err := buckets.DeviceID(d.ID).Validate(); err != nil {
			errs = append(errs, fmt.Errorf("%s: id: %w", who, err))
		}
		if ids[d.ID] {
			errs = append(errs, fmt.Errorf("%s: id appears twice", who))
		}
		ids[d.ID] = true
		if _, err := parseHash(d.Secret); err != nil {
			errs = append(errs, fmt.Errorf("%s: secret %w", who, err))
		} else {
			seen(strings.ToLower(d.Secret), who)
		}
		if len(d.PublishAs) > MaxPatterns {
			errs = append(errs, fmt.Errorf("%s: publishAs has %d entries, more than %d", who, len(d.PublishAs), MaxPatterns))
			continue
		}
		for _, id := range d.PublishAs {
			if id != "*" && buckets.DeviceID(id).Validate() != nil {
				errs = append(errs, fmt.Errorf("%s: publishAs %q must be a device ID or \"*\"", who, id))
			}
		}
	}
	names := map[string]bool{}
	for i, t := range f.Tokens {
		who := fmt.Sprintf("tokens[%d] (%q)", i, t.Name)
		if !tokenNameRE.MatchString(t.Name) {
			errs = append(errs, fmt.Errorf("%s: name must match %s", who, tokenNameRE))
		}
		if names[t.Name] {
			errs = append(errs, fmt.Errorf("%s: name appears twice", who))
		}
		names[t.Name] = true
		if _, err := parseHash(t.Secret); err != nil {
			errs = append(errs, fmt.Errorf("%s: secret %w", who, err))
		} else {
			seen(strings.ToLower(t.Secret), who)
		}
		if len(t.Scopes) == 0 {
			errs = append(errs, fmt.Errorf("%s: scopes must name at least one of %v", who, Scopes))
		}
		for _, s := range t.Scopes {
			if !slices.Contains(Scopes, s) {
				errs = append(errs, fmt.Errorf("%s: scope %q is not one of %v", who, s, Scopes))
			}
		}
		if len(t.Devices) > MaxPatterns {
			errs = append(errs, fmt.Errorf("%s: %d device patterns, more than %d", who, len(t.Devices), MaxPatterns))
			continue
		}
		for _, p := range t.Devices {
			if err := ValidatePattern(p); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", who, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Load reads and parses the auth file at name.
func Load(name string) (*File, error) {
	fh, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("auth file: %w", err)
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("auth file %s: %w", name, err)
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return f, nil
}

// Save writes f to name atomically (a temporary file in the same
// directory, fsynced, then renamed) with mode 0600, creating the
// directory (mode 0700) when it is missing.
func Save(name string, f *File) error {
	if err := f.Validate(); err != nil {
		return err
	}
	if f.Devices == nil {
		f.Devices = []Device{}
	}
	if f.Tokens == nil {
		f.Tokens = []Token{}
	}
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode auth file: %w", err)
	}
	data = append(data, '\n')
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return fmt.Errorf("write auth file: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(name), "."+filepath.Base(name)+".tmp*")
	if err != nil {
		return fmt.Errorf("write auth file: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op after the rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write auth file: %w", err)
	}
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write auth file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write auth file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write auth file: %w", err)
	}
	if err := os.Rename(tmp.Name(), name); err != nil {
		return fmt.Errorf("write auth file: %w", err)
	}
	return nil
}

// equalHash compares the hash of a presented secret with a stored
// hash in constant time.
func equalHash(got, want [sha256.Size]byte) bool {
	return subtle.ConstantTimeCompare(got[:], want[:]) == 1
}
