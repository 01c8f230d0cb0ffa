// Package cursorkey keeps an installation's pagination cursor key: 32
// random bytes in its data directory, made on first start, so cursors
// survive restarts and each installation seals its own.
package cursorkey

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// File is the key's file name in the data directory.
const File = "cursor.key"

// Load returns the key kept in dataDir, generating it (32 random bytes,
// hex, mode 0600) when there is none.
func Load(dataDir string) ([]byte, error) {
	path := filepath.Join(dataDir, File)
	if b, err := os.ReadFile(path); err == nil {
		key, err := hex.DecodeString(strings.TrimSpace(string(b)))
		if err != nil || len(key) < 16 {
			return nil, fmt.Errorf("cursor key %s is damaged; delete it to make a new one (open cursors then fail once)", path)
		}
		return key, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("cursor key: %w", err)
	}
	_, werr := f.WriteString(hex.EncodeToString(key) + "\n")
	if err := errors.Join(werr, f.Sync(), f.Close()); err != nil {
		return nil, fmt.Errorf("cursor key %s: %w", path, err)
	}
	return key, nil
}
