package main

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"runtime/pprof"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"
)

// cpuProfile is what a CPU profile of the process holds: each sample's
// CPU time and the names of the functions on its stack.
type cpuProfile struct {
	samples []profileSample
}

type profileSample struct {
	cpu   time.Duration
	funcs []string // each function once, innermost first
}

// total is the CPU time of every sample.
func (p cpuProfile) total() time.Duration {
	var d time.Duration
	for _, s := range p.samples {
		d += s.cpu
	}
	return d
}

// under is the CPU time of the samples whose stack holds fn (a full
// name, as pprof prints it).
func (p cpuProfile) under(fn string) time.Duration {
	var d time.Duration
	for _, s := range p.samples {
		if slices.Contains(s.funcs, fn) {
			d += s.cpu
		}
	}
	return d
}

// outside is the CPU time of the samples whose stack holds a function
// whose name starts with one of prefixes, and not fn.
func (p cpuProfile) outside(fn string, prefixes ...string) time.Duration {
	var d time.Duration
	for _, s := range p.samples {
		if !slices.Contains(s.funcs, fn) && slices.ContainsFunc(s.funcs, func(f string) bool {
			return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(f, p) })
		}) {
			d += s.cpu
		}
	}
	return d
}

// profileCPU runs fn under the CPU profiler and returns the profile,
// and its bytes as runtime/pprof writes them. It fails when the
// profiler is already in use (go test -cpuprofile).
func profileCPU(t testing.TB, fn func()) (cpuProfile, []byte) {
	t.Helper()
	var buf bytes.Buffer
	require.NoError(t, pprof.StartCPUProfile(&buf), "the test profiles itself: run it without -cpuprofile")
	fn()
	pprof.StopCPUProfile()
	p, err := parseCPUProfile(buf.Bytes())
	require.NoError(t, err)
	return p, buf.Bytes()
}

// parseCPUProfile reads the samples of a gzipped profile.proto as
// runtime/pprof writes it (the fields of google/pprof's profile.proto
// used here: sample_type 1, sample 2, location 4, function 5,
// string_table 6).
func parseCPUProfile(gz []byte) (cpuProfile, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return cpuProfile{}, fmt.Errorf("profile: %w", err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		return cpuProfile{}, fmt.Errorf("profile: %w", err)
	}
	type rawSample struct{ locs, values []uint64 }
	var (
		types    [][]uint64 // each sample type's type and unit, as string indexes
		samples  []rawSample
		locFuncs = map[uint64][]uint64{} // location id: function ids, innermost first
		funcName = map[uint64]uint64{}   // function id: name's string index
		strs     []string
	)
	err = eachField(b, func(num protowire.Number, typ protowire.Type, v []byte, _ uint64) error {
		switch num {
		case 1:
			var st []uint64
			return eachField(v, func(num protowire.Number, typ protowire.Type, _ []byte, x uint64) error {
				st = append(st, x)
				if len(st) == 2 {
					types = append(types, st)
				}
				return nil
			})
		case 2:
			var s rawSample
			if err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				var err error
				switch num {
				case 1:
					s.locs, err = appendVarints(s.locs, typ, v, x)
				case 2:
					s.values, err = appendVarints(s.values, typ, v, x)
				}
				return err
			}); err != nil {
				return err
			}
			samples = append(samples, s)
		case 4:
			var id uint64
			var fns []uint64
			if err := eachField(v, func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error {
				switch num {
				case 1:
					id = x
				case 4: // a line: function_id is its field 1
					return eachField(v, func(num protowire.Number, _ protowire.Type, _ []byte, x uint64) error {
						if num == 1 {
							fns = append(fns, x)
						}
						return nil
					})
				}
				return nil
			}); err != nil {
				return err
			}
			locFuncs[id] = fns
		case 5:
			var id, name uint64
			if err := eachField(v, func(num protowire.Number, _ protowire.Type, _ []byte, x uint64) error {
				switch num {
				case 1:
					id = x
				case 2:
					name = x
				}
				return nil
			}); err != nil {
				return err
			}
			funcName[id] = name
		case 6:
			strs = append(strs, string(v))
		}
		return nil
	})
	if err != nil {
		return cpuProfile{}, fmt.Errorf("profile: %w", err)
	}
	str := func(i uint64) string {
		if i < uint64(len(strs)) {
			return strs[i]
		}
		return ""
	}
	cpu := -1 // the index of the values in nanoseconds of CPU
	for i, st := range types {
		if str(st[0]) == "cpu" && str(st[1]) == "nanoseconds" {
			cpu = i
		}
	}
	if cpu < 0 {
		return cpuProfile{}, fmt.Errorf("profile: no cpu/nanoseconds samples")
	}
	var p cpuProfile
	for _, s := range samples {
		if cpu >= len(s.values) {
			continue
		}
		ps := profileSample{cpu: time.Duration(s.values[cpu])}
		for _, l := range s.locs {
			for _, f := range locFuncs[l] {
				if n := str(funcName[f]); !slices.Contains(ps.funcs, n) {
					ps.funcs = append(ps.funcs, n)
				}
			}
		}
		p.samples = append(p.samples, ps)
	}
	return p, nil
}

// eachField calls fn with each field of the protobuf message b: its
// bytes for a length-delimited field, its value for a varint.
func eachField(b []byte, fn func(num protowire.Number, typ protowire.Type, v []byte, x uint64) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		var v []byte
		var x uint64
		switch typ {
		case protowire.BytesType:
			v, n = protowire.ConsumeBytes(b)
		case protowire.VarintType:
			x, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if err := fn(num, typ, v, x); err != nil {
			return err
		}
	}
	return nil
}

// appendVarints appends a repeated integer field's values: packed (v)
// or one (x).
func appendVarints(dst []uint64, typ protowire.Type, v []byte, x uint64) ([]uint64, error) {
	if typ == protowire.VarintType {
		return append(dst, x), nil
	}
	for len(v) > 0 {
		x, n := protowire.ConsumeVarint(v)
		if n < 0 {
			return dst, protowire.ParseError(n)
		}
		dst, v = append(dst, x), v[n:]
	}
	return dst, nil
}

// TestParseCPUProfile checks the profile reader on a profile of this
// process: a function that spins is under itself, and the total is
// about the process's CPU time meanwhile.
func TestParseCPUProfile(t *testing.T) {
	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		t.Skipf("the profiler is in use: %v", err)
	}
	pprof.StopCPUProfile()
	var c0, c1 time.Duration
	p, _ := profileCPU(t, func() {
		c0 = cpuTime(t)
		spinCPU(t, 300*time.Millisecond)
		c1 = cpuTime(t)
	})
	spin := p.under("github.com/telemetryd/telemetryd/cmd/telemetryd.spinCPU")
	require.Positive(t, spin, "samples under spinCPU")
	require.LessOrEqual(t, spin, p.total())
	require.LessOrEqual(t, p.total(), 2*(c1-c0)+100*time.Millisecond, "the profile's CPU against the process's")
	require.Zero(t, p.under("no.such.function"))
}

// spinCPU uses d of the process's CPU time.
//
//go:noinline
func spinCPU(t testing.TB, d time.Duration) {
	c0 := cpuTime(t)
	x := 0
	for cpuTime(t)-c0 < d {
		for i := range 10000 {
			x += i
		}
	}
	_ = x
}
