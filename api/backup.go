package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// backupPath is the route of the online backup (scope admin).
const backupPath = "/v1/backup"

// MaxBackupBodyBytes bounds the body of POST /v1/backup.
const MaxBackupBodyBytes = 4 << 10

// Backups takes backups of the running service's data. A nil Backups
// makes POST /v1/backup answer 501, naming the service's -backup-dir
// flag that turns them on.
type Backups interface {
	// Backup copies every day table and the device index into dir, a
	// clean absolute path on the server that the handler has checked to
	// lie under Config.BackupRoot, incrementally against the previous
	// backup there unless full. An error wrapping
	// buckets.ErrInvalidArgument goes back to the client as a 400.
	Backup(ctx context.Context, dir string, full bool) (BackupSummary, error)
}

// BackupRequest is the body of POST /v1/backup.
type BackupRequest struct {
	// Dir is the backup directory on the server's file system: an
	// absolute path under the server's backup root.
	Dir string `json:"dir"`
	// Full starts a new chain instead of copying only what changed.
	Full bool `json:"full,omitempty"`
}

// BackupSummary is the answer of POST /v1/backup: what the backup
// copied and the stream positions it is consistent with.
type BackupSummary struct {
	Dir         string            `json:"dir"`
	ID          int               `json:"id"`
	Created     time.Time         `json:"created"`
	Tables      int               `json:"tables"`
	Skipped     int               `json:"skippedTables"`
	CopiedFiles int               `json:"copiedFiles"`
	CopiedBytes int64             `json:"copiedBytes"`
	TotalBytes  int64             `json:"totalBytes"`
	Positions   map[string]uint64 `json:"positions"`
}

// handleBackup serves POST /v1/backup (admin). It runs for as long as
// the copy takes, so it lifts the write deadline; a client that goes
// away cancels the backup, which then leaves nothing behind.
func (s *Server) handleBackup(c echo.Context) error {
	if s.backups == nil {
		return notImplemented("online backups are off on this instance (-backup-dir off): start telemetryd with -backup-dir DIR, or take the backup from the stopped data dir with telemetryd backup -data-dir")
	}
	req, err := readBackupRequest(c.Request())
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	if err := http.NewResponseController(c.Response()).SetWriteDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	if err := backupDirAllowed(s.backupRoot, req.Dir); err != nil {
		return readerError(err, "backup into %s", req.Dir)
	}
	started := time.Now()
	sum, err := s.backups.Backup(ctx, req.Dir, req.Full)
	if err != nil {
		return readerError(err, "backup into %s", req.Dir)
	}
	s.log.InfoContext(ctx, "backup taken by admin request", "dir", sum.Dir, "id", sum.ID,
		"copied_bytes", sum.CopiedBytes, "skipped_tables", sum.Skipped, "duration", time.Since(started),
		"remote", c.Request().RemoteAddr)
	return sendValue(c, http.StatusOK, sum)
}

// readBackupRequest reads and checks the body of POST /v1/backup.
func readBackupRequest(r *http.Request) (BackupRequest, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBackupBodyBytes+1))
	if err != nil {
		return BackupRequest{}, err
	}
	if len(body) > MaxBackupBodyBytes {
		return BackupRequest{}, &apiError{http.StatusRequestEntityTooLarge, codePayloadTooLarge, "body: larger than 4096 bytes"}
	}
	var req BackupRequest
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		return BackupRequest{}, invalidArg("body", `must be a JSON object {"dir": "/absolute/path", "full": false}: %s`, err.Error())
	}
	switch {
	case req.Dir == "":
		return req, invalidArg("dir", "is required: the backup directory on the server")
	case !filepath.IsAbs(req.Dir):
		return req, invalidArg("dir", "%q is not an absolute path", req.Dir)
	case filepath.Clean(req.Dir) != req.Dir:
		return req, invalidArg("dir", "%q is not a clean path (write it as %q)", req.Dir, filepath.Clean(req.Dir))
	}
	return req, nil
}

// backupDirAllowed refuses a backup directory dir (a clean absolute
// path) outside root, also through symbolic links: the nearest existing
// ancestor of dir is resolved and must lie in root before dir is
// created, and dir itself after. It creates root and dir. The refusal
// wraps buckets.ErrInvalidArgument.
func backupDirAllowed(root, dir string) error {
	outside := fmt.Errorf("%w: dir: %s is outside the backup root %s (-backup-dir)", buckets.ErrInvalidArgument, dir, root)
	if rel, err := filepath.Rel(root, dir); err != nil || rel == "." || !filepath.IsLocal(rel) {
		return outside
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("backup root: %w", err)
	}
	realRoot, err := filepath.EvalSymlinks(root)
	if err != nil {
		return fmt.Errorf("backup root: %w", err)
	}
	within := func(p string) bool {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			return false
		}
		rel, err := filepath.Rel(realRoot, real)
		return err == nil && filepath.IsLocal(rel)
	}
	existing := dir
	for {
		if _, err := os.Lstat(existing); err == nil {
			break
		}
		existing = filepath.Dir(existing)
	}
	if !within(existing) {
		return outside
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("backup directory: %w", err)
	}
	if !within(dir) {
		return outside
	}
	return nil
}
