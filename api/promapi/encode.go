package promapi

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/common/model"
)

// Error types of the Prometheus API and their HTTP status.
type errorType string

const (
	errBadData     errorType = "bad_data"
	errExec        errorType = "execution"
	errTimeout     errorType = "timeout"
	errCanceled    errorType = "canceled"
	errInternal    errorType = "internal"
	errUnavailable errorType = "unavailable"
	errNotFound    errorType = "not_found"
)

func (t errorType) status() int {
	switch t {
	case errBadData:
		return http.StatusBadRequest
	case errExec:
		return http.StatusUnprocessableEntity
	case errTimeout, errCanceled, errUnavailable:
		return http.StatusServiceUnavailable
	case errNotFound:
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}

// apiError is an error answer.
type apiError struct {
	typ errorType
	msg string
}

func (e *apiError) Error() string { return string(e.typ) + ": " + e.msg }

// badData is a 400 bad_data naming param: `invalid parameter "step": ...`.
func badData(param, format string, args ...any) *apiError {
	return &apiError{typ: errBadData, msg: describe(param) + fmt.Sprintf(format, args...)}
}

// response is the Prometheus API envelope.
type response struct {
	Status    string    `json:"status"`
	Data      any       `json:"data,omitempty"`
	ErrorType errorType `json:"errorType,omitempty"`
	Error     string    `json:"error,omitempty"`
	Warnings  []string  `json:"warnings,omitempty"`
}

func writeData(w http.ResponseWriter, data any, warnings []string) {
	write(w, http.StatusOK, response{Status: "success", Data: data, Warnings: warnings})
}

func writeError(w http.ResponseWriter, e *apiError) {
	write(w, e.typ.status(), response{Status: "error", ErrorType: e.typ, Error: e.msg})
}

func write(w http.ResponseWriter, status int, r response) {
	b, err := json.Marshal(r)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"status":"error","errorType":"internal","error":"cannot encode the answer"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// parseTime parses Unix seconds (with a fraction) or RFC 3339, as the
// Prometheus API does.
func parseTime(s string) (time.Time, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > 1e13 {
			return time.Time{}, fmt.Errorf("cannot parse %q to a valid timestamp", s)
		}
		sec, frac := math.Modf(f)
		return time.Unix(int64(sec), int64(math.Round(frac*1e9))).UTC(), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("cannot parse %q to a valid timestamp", s)
}

// parseDuration parses seconds (with a fraction) or a Prometheus
// duration ("5m", "1h30m", "1d").
func parseDuration(s string) (time.Duration, error) {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		ts := f * float64(time.Second)
		if math.IsNaN(ts) || ts > float64(math.MaxInt64) || ts < float64(math.MinInt64) {
			return 0, fmt.Errorf("cannot parse %q to a valid duration. It overflows int64", s)
		}
		return time.Duration(ts), nil
	}
	if d, err := model.ParseDuration(s); err == nil {
		return time.Duration(d), nil
	}
	return 0, fmt.Errorf("cannot parse %q to a valid duration", s)
}

func sortedUnique(ss []string) []string {
	slices.SortFunc(ss, strings.Compare)
	ss = slices.Compact(ss)
	if ss == nil {
		ss = []string{}
	}
	return ss
}
