package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/telemetryd/telemetryd/buckets"
)

// Repairer rebuilds a damaged day table; an Admin that implements it
// serves POST /v1/tables/{day}/repair (else 501).
type Repairer interface {
	// RepairTable rebuilds the table of day from what is readable of
	// it, the stream's readings of the day and, when backup is set, the
	// newest backup in that directory (checked to lie under
	// Config.BackupRoot). An error wrapping buckets.ErrNotFound means
	// there is no table of day.
	RepairTable(ctx context.Context, day buckets.Day, backup string) (TableRepair, error)
}

// TableRepair is the answer of POST /v1/tables/{day}/repair.
type TableRepair struct {
	Day            string `json:"day"`
	FromBackup     int64  `json:"fromBackup"`
	Salvaged       int64  `json:"salvaged"`
	FromStream     int64  `json:"fromStream"`
	BadBlocks      int    `json:"badBlocks"`
	SkippedDevices int    `json:"skippedDevices"`
	SalvageError   string `json:"salvageError,omitempty"`
	// DamagedCopy is where the damaged table was moved on the server.
	DamagedCopy string `json:"damagedCopy"`
}

// RepairRequest is the optional body of POST /v1/tables/{day}/repair.
type RepairRequest struct {
	// Backup is a backup directory under the server's backup root.
	Backup string `json:"backup,omitempty"`
}

// handleRepairTable serves POST /v1/tables/{day}/repair (admin). It
// runs for as long as the rebuild takes.
func (s *Server) handleRepairTable(c echo.Context) error {
	raw, err := pathParam(c, "day")
	if err != nil {
		return err
	}
	day, err := buckets.ParseDay(raw)
	if err != nil {
		return invalidArg("day", "%s", err.Error())
	}
	r, ok := s.admin.(Repairer)
	if !ok {
		return notImplemented("repairs are not served by this instance")
	}
	req, err := readRepairRequest(c.Request())
	if err != nil {
		return err
	}
	if req.Backup != "" {
		if err := backupReadable(s.backupRoot, req.Backup); err != nil {
			return readerError(err, "repair table %s", day)
		}
	}
	if err := http.NewResponseController(c.Response()).SetWriteDeadline(time.Time{}); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return err
	}
	ctx := c.Request().Context()
	rep, err := r.RepairTable(ctx, day, req.Backup)
	if errors.Is(err, buckets.ErrNotFound) {
		return notFound("day", "there is no table for %s", day)
	}
	if err != nil {
		return readerError(err, "repair table %s", day)
	}
	s.log.InfoContext(ctx, "table repaired by admin request", "day", day.String(), "from_backup", rep.FromBackup,
		"salvaged", rep.Salvaged, "from_stream", rep.FromStream, "remote", c.Request().RemoteAddr)
	return sendValue(c, http.StatusOK, rep)
}

// readRepairRequest reads the optional body of a repair.
func readRepairRequest(r *http.Request) (RepairRequest, error) {
	var req RepairRequest
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBackupBodyBytes+1))
	if err != nil {
		return req, err
	}
	if len(body) > MaxBackupBodyBytes {
		return req, &apiError{http.StatusRequestEntityTooLarge, codePayloadTooLarge, "body: larger than 4096 bytes"}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return req, nil
	}
	d := json.NewDecoder(bytes.NewReader(body))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		return req, invalidArg("body", `must be empty or a JSON object {"backup": "/absolute/path"}: %s`, err.Error())
	}
	if req.Backup != "" && (!filepath.IsAbs(req.Backup) || filepath.Clean(req.Backup) != req.Backup) {
		return req, invalidArg("backup", "%q is not a clean absolute path", req.Backup)
	}
	return req, nil
}

// backupReadable refuses a backup directory outside root (through
// symbolic links too) or one that does not exist; the refusal wraps
// buckets.ErrInvalidArgument.
func backupReadable(root, dir string) error {
	outside := fmt.Errorf("%w: backup: %s is outside the backup root %s (-backup-dir)", buckets.ErrInvalidArgument, dir, root)
	if root == "" {
		return fmt.Errorf("%w: backup: no backup root is configured (-backup-dir)", buckets.ErrInvalidArgument)
	}
	realRoot, err1 := filepath.EvalSymlinks(root)
	real, err2 := filepath.EvalSymlinks(dir)
	if err1 != nil || err2 != nil {
		return fmt.Errorf("%w: backup: %s does not exist", buckets.ErrInvalidArgument, dir)
	}
	if rel, err := filepath.Rel(realRoot, real); err != nil || !filepath.IsLocal(rel) {
		return outside
	}
	return nil
}
