package promapi

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMatrixEncodingIsEncodingJSONs checks that the hand-written matrix
// answer is byte for byte what json.Marshal writes for it.
func TestMatrixEncodingIsEncodingJSONs(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	odd := []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1), 1e-7, -1e-7, 1e21, 1e300,
		math.SmallestNonzeroFloat64, math.MaxFloat64, 0.1, 21.45, -3, 123456789.125}
	times := []int64{0, 1, -1, 10, 100, 120, 999, -1001, 1795258500000, 1795258500123, 1795258500020, 1795258500300,
		-62135596800000, 253402300799999, 1e15 - 1, 1e15, -1e15, 1e17, math.MaxInt64, math.MinInt64}
	for round := range 2000 {
		var m promql.Matrix
		for range rng.IntN(5) {
			s := promql.Series{Metric: labels.FromStrings("__name__", "temp", "device", []string{"d-1", `a"b<c>&d`, "ünï", ""}[rng.IntN(4)])}
			for range rng.IntN(6) {
				p := promql.FPoint{T: times[rng.IntN(len(times))], F: rng.NormFloat64() * 100}
				if rng.IntN(2) == 0 {
					p.T = rng.Int64N(2e15) - 1e15
				}
				if rng.IntN(3) == 0 {
					p.F = odd[rng.IntN(len(odd))]
				}
				s.Floats = append(s.Floats, p)
			}
			m = append(m, s)
		}
		if m == nil {
			m = promql.Matrix{}
		}
		var warnings []string
		if round%7 == 0 {
			warnings = []string{"a warning <with> \"quotes\""}
		}
		want, err := json.Marshal(response{Status: "success", Data: queryData{ResultType: parser.ValueTypeMatrix, Result: m}, Warnings: warnings})
		require.NoError(t, err)
		got, ok := appendMatrixResponse(nil, m, warnings)
		require.True(t, ok)
		require.Equal(t, string(want), string(got))
	}
}

// TestVectorEncodingIsEncodingJSONs is the same for an instant query's
// vector, with labels that need escaping.
func TestVectorEncodingIsEncodingJSONs(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	values := []string{"truck_7", `a"b<c>&d`, "ünï", "", "tab\there", "back\\slash", "\x7f", "\u2028", "\xff\xfe", "East"}
	odd := []float64{0, math.Copysign(0, -1), math.NaN(), math.Inf(1), math.Inf(-1), 1e-7, 1e21, 0.1, -3}
	for round := range 2000 {
		var v promql.Vector
		for range rng.IntN(5) {
			var ls []string
			for _, name := range []string{"__name__", "device", "fleet", "model", "x<y"}[:1+rng.IntN(5)] {
				ls = append(ls, name, values[rng.IntN(len(values))])
			}
			s := promql.Sample{Metric: labels.FromStrings(ls...), T: rng.Int64N(2e15) - 1e15, F: rng.NormFloat64() * 100}
			if rng.IntN(3) == 0 {
				s.F = odd[rng.IntN(len(odd))]
			}
			v = append(v, s)
		}
		if v == nil {
			v = promql.Vector{}
		}
		var warnings []string
		if round%7 == 0 {
			warnings = []string{"a warning <with> \"quotes\""}
		}
		want, err := json.Marshal(response{Status: "success", Data: queryData{ResultType: parser.ValueTypeVector, Result: v}, Warnings: warnings})
		require.NoError(t, err)
		got, ok := appendVectorResponse(nil, v, warnings)
		require.True(t, ok)
		require.Equal(t, string(want), string(got))
	}
	h := promql.Vector{{Metric: labels.FromStrings("__name__", "h"), T: 1000, H: &histogram.FloatHistogram{Count: 2, Sum: 3}}}
	_, ok := appendVectorResponse(nil, h, nil)
	assert.False(t, ok, "histograms go to encoding/json")
	rec := httptest.NewRecorder()
	writeVector(rec, h, nil)
	want, err := json.Marshal(response{Status: "success", Data: queryData{ResultType: parser.ValueTypeVector, Result: h}})
	require.NoError(t, err)
	assert.Equal(t, string(want)+"\n", rec.Body.String())
}

func TestMatrixWithHistogramsGoesToEncodingJSON(t *testing.T) {
	m := promql.Matrix{{Metric: labels.FromStrings("__name__", "h"),
		Histograms: []promql.HPoint{{T: 1000, H: &histogram.FloatHistogram{Count: 2, Sum: 3}}}}}
	_, ok := appendMatrixResponse(nil, m, nil)
	assert.False(t, ok)
	rec := httptest.NewRecorder()
	writeMatrix(rec, m, nil)
	assert.Equal(t, http.StatusOK, rec.Code)
	want, err := json.Marshal(response{Status: "success", Data: queryData{ResultType: parser.ValueTypeMatrix, Result: m}})
	require.NoError(t, err)
	assert.Equal(t, string(want)+"\n", rec.Body.String())
}

// fleetMatrix is the answer of a fleet query: 1,000 series of 289
// points.
func fleetMatrix() promql.Matrix {
	m := make(promql.Matrix, 1000)
	for i := range m {
		m[i].Metric = labels.FromStrings("device", "fleet-"+string(rune('a'+i%26))+string(rune('a'+i/26%26)))
		for j := range 289 {
			m[i].Floats = append(m[i].Floats, promql.FPoint{T: 1795258500000 + int64(j)*300000, F: float64(i%50) + float64(j%60)/6})
		}
	}
	return m
}

func BenchmarkMatrixAnswer(b *testing.B) {
	m := fleetMatrix()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := appendMatrixResponse(nil, m, nil); !ok {
			b.Fatal("not encoded")
		}
	}
}

func BenchmarkMatrixAnswerEncodingJSON(b *testing.B) {
	m := fleetMatrix()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(response{Status: "success", Data: queryData{ResultType: parser.ValueTypeMatrix, Result: m}}); err != nil {
			b.Fatal(err)
		}
	}
}

// fleetVector is the answer of a fleet question: a sample per truck of
// a fleet, each with the truck's attributes.
func fleetVector() promql.Vector {
	v := make(promql.Vector, 125)
	for i := range v {
		v[i] = promql.Sample{Metric: labels.FromStrings("device", "truck_"+strconv.Itoa(i), "device_version", "v1.5",
			"driver", "Trish", "fleet", "East", "model", "H-2"), T: 1795586390000, F: float64(i) / 7}
	}
	return v
}

func BenchmarkVectorAnswer(b *testing.B) {
	v := fleetVector()
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := appendVectorResponse(nil, v, nil); !ok {
			b.Fatal("not encoded")
		}
	}
}

func BenchmarkVectorAnswerEncodingJSON(b *testing.B) {
	v := fleetVector()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := json.Marshal(response{Status: "success", Data: queryData{ResultType: parser.ValueTypeVector, Result: v}}); err != nil {
			b.Fatal(err)
		}
	}
}
