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
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
)

// ErrorType is the errorType of an error answer of the Prometheus API;
// each has its HTTP status. Other types (unauthenticated,
// permission_denied, ...) name what the server's own codes name.
type ErrorType string

// The error types of the Prometheus API.

const (
	ErrorBadData     ErrorType = "bad_data"
	ErrorExec        ErrorType = "execution"
	ErrorTimeout     ErrorType = "timeout"
	ErrorCanceled    ErrorType = "canceled"
	ErrorInternal    ErrorType = "internal"
	ErrorUnavailable ErrorType = "unavailable"
	ErrorNotFound    ErrorType = "not_found"
)

func (t ErrorType) status() int {
	switch t {
	case ErrorBadData:
		return http.StatusBadRequest
	case ErrorExec:
		return http.StatusUnprocessableEntity
	case ErrorTimeout, ErrorCanceled, ErrorUnavailable:
		return http.StatusServiceUnavailable
	case ErrorNotFound:
		return http.StatusNotFound
	}
	return http.StatusInternalServerError
}

// apiError is an error answer.
type apiError struct {
	typ ErrorType
	msg string
}

func (e *apiError) Error() string { return string(e.typ) + ": " + e.msg }

// badData is a 400 bad_data naming param: `invalid parameter "step": ...`.
func badData(param, format string, args ...any) *apiError {
	return &apiError{typ: ErrorBadData, msg: describe(param) + fmt.Sprintf(format, args...)}
}

// response is the Prometheus API envelope. Its keys are spelled as
// Prometheus spells them (errorType, not ErrorType): Go's decoder
// matches keys without regard to case, but Grafana's browser side and
// other JSON readers do not.
type response struct {
	Status    string    `json:"status"`
	Data      any       `json:"data,omitempty"`
	ErrorType ErrorType `json:"errorType,omitempty"`
	Error     string    `json:"error,omitempty"`
	Warnings  []string  `json:"warnings,omitempty"`
}

func writeData(w http.ResponseWriter, data any, warnings []string) {
	write(w, http.StatusOK, response{Status: "success", Data: data, Warnings: warnings})
}

func writeError(w http.ResponseWriter, e *apiError) {
	WriteError(w, e.typ.status(), e.typ, e.msg)
}

// WriteError answers with the Prometheus API's error envelope
// {"status":"error","errorType":typ,"error":msg} and status: the shape
// Grafana, promtool and the Prometheus Go client read, so the server's
// own answers under the API's path (401, 403, 429, 503, ...) take it
// too.
func WriteError(w http.ResponseWriter, status int, typ ErrorType, msg string) {
	write(w, status, response{Status: "error", ErrorType: typ, Error: msg})
}

func write(w http.ResponseWriter, status int, r response) {
	b, err := json.Marshal(r)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"status":"error","errorType":"internal","error":"cannot encode the answer"}`)
	}
	writeBody(w, status, b)
}

// writeMatrix writes the answer of a query whose result is m. A range
// query over a fleet answers hundreds of thousands of points, and
// encoding/json spent a quarter of such a query's CPU on them (through
// FPoint.MarshalJSON), so float matrices are encoded here; the bytes
// are json.Marshal's (tested). Anything else goes to json.Marshal.
func writeMatrix(w http.ResponseWriter, m promql.Matrix, warnings []string) {
	b, ok := appendMatrixResponse(make([]byte, 0, 64+len(m)*(64+32*avgPoints(m))), m, warnings)
	if !ok {
		writeData(w, queryData{ResultType: parser.ValueTypeMatrix, Result: m}, warnings)
		return
	}
	writeBody(w, http.StatusOK, b)
}

// writeVector is writeMatrix for an instant query's vector: a fleet
// question answers a sample per truck, each with the truck's
// attributes as labels, whose encoding through reflection cost a tenth
// of such a query's CPU.
func writeVector(w http.ResponseWriter, v promql.Vector, warnings []string) {
	b, ok := appendVectorResponse(make([]byte, 0, 64+len(v)*160), v, warnings)
	if !ok {
		writeData(w, queryData{ResultType: parser.ValueTypeVector, Result: v}, warnings)
		return
	}
	writeBody(w, http.StatusOK, b)
}

func avgPoints(m promql.Matrix) int {
	n := 0
	for i := range m {
		n += len(m[i].Floats)
	}
	return n / max(len(m), 1)
}

// appendMatrixResponse appends the success envelope of m; ok is false
// when m holds what it does not encode (histograms, a nil matrix).
func appendMatrixResponse(b []byte, m promql.Matrix, warnings []string) ([]byte, bool) {
	if m == nil {
		return b, false
	}
	b = append(b, `{"status":"success","data":{"resultType":"matrix","result":[`...)
	for i := range m {
		s := &m[i]
		if len(s.Histograms) > 0 {
			return b, false
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLabels(append(b, `{"metric":`...), s.Metric)
		if len(s.Floats) > 0 {
			b = append(b, `,"values":[`...)
			for j, p := range s.Floats {
				if j > 0 {
					b = append(b, ',')
				}
				var ok bool
				if b, ok = appendPoint(b, p.T, p.F); !ok {
					return b, false
				}
			}
			b = append(b, ']')
		}
		b = append(b, '}')
	}
	return appendEnd(b, warnings)
}

// appendVectorResponse is appendMatrixResponse for a vector.
func appendVectorResponse(b []byte, v promql.Vector, warnings []string) ([]byte, bool) {
	if v == nil {
		return b, false
	}
	b = append(b, `{"status":"success","data":{"resultType":"vector","result":[`...)
	for i := range v {
		s := &v[i]
		if s.H != nil {
			return b, false
		}
		if i > 0 {
			b = append(b, ',')
		}
		b = appendLabels(append(b, `{"metric":`...), s.Metric)
		var ok bool
		if b, ok = appendPoint(append(b, `,"value":`...), s.T, s.F); !ok {
			return b, false
		}
		b = append(b, '}')
	}
	return appendEnd(b, warnings)
}

// appendPoint appends [seconds,"value"] as FPoint.MarshalJSON writes it.
func appendPoint(b []byte, t int64, f float64) ([]byte, bool) {
	b = append(b, '[')
	b, err := appendSeconds(b, t)
	if err != nil {
		return b, false
	}
	b = append(b, ',', '"')
	b = strconv.AppendFloat(b, f, 'f', -1, 64) // digits, '.', '-', NaN, +Inf, -Inf: nothing to escape
	return append(b, '"', ']'), true
}

// appendEnd closes the result list and the envelope, with warnings.
func appendEnd(b []byte, warnings []string) ([]byte, bool) {
	b = append(b, "]}"...)
	if len(warnings) > 0 {
		ws, err := json.Marshal(warnings)
		if err != nil {
			return b, false
		}
		b = append(b, `,"warnings":`...)
		b = append(b, ws...)
	}
	return append(b, '}'), true
}

// appendLabels appends ls as labels.Labels.MarshalJSON writes them: an
// object of the labels sorted by name (the order ls keeps them in),
// each string as encoding/json escapes it.
func appendLabels(b []byte, ls labels.Labels) []byte {
	b = append(b, '{')
	first := true
	ls.Range(func(l labels.Label) {
		if !first {
			b = append(b, ',')
		}
		first = false
		b = append(appendJSONString(b, l.Name), ':')
		b = appendJSONString(b, l.Value)
	})
	return append(b, '}')
}

// appendJSONString appends s quoted as encoding/json quotes it: printable
// ASCII other than '"', '\\', '<', '>' and '&' as itself, anything else
// through json.Marshal.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s) // a string always encodes
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendSeconds appends the milliseconds ms as seconds, as
// encoding/json writes float64(ms)/1000: below 10^15 ms (31,000 years)
// that double's shortest decimal is ms/1000 itself, so it is written
// from the integer.
func appendSeconds(b []byte, ms int64) ([]byte, error) {
	if ms <= -1e15 || ms >= 1e15 {
		return appendJSONFloat(b, float64(ms)/1000)
	}
	if ms < 0 {
		b, ms = append(b, '-'), -ms
	}
	b = strconv.AppendInt(b, ms/1000, 10)
	frac := ms % 1000
	if frac == 0 {
		return b, nil
	}
	b = append(b, '.', byte('0'+frac/100))
	if frac%100 != 0 {
		b = append(b, byte('0'+frac/10%10))
		if frac%10 != 0 {
			b = append(b, byte('0'+frac%10))
		}
	}
	return b, nil
}

// appendJSONFloat appends f as encoding/json writes a float64.
func appendJSONFloat(b []byte, f float64) ([]byte, error) {
	if a := math.Abs(f); a == 0 || (a >= 1e-6 && a < 1e21) {
		return strconv.AppendFloat(b, f, 'f', -1, 64), nil
	}
	x, err := json.Marshal(f)
	return append(b, x...), err
}

// writeBody writes an encoded answer and a newline.
func writeBody(w http.ResponseWriter, status int, b []byte) {
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
