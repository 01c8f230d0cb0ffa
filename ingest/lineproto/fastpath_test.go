package lineproto

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
)

// readingsOf decodes every message of res into device -> readings in
// message order.
func readingsOf(t *testing.T, res linemsg.Result) map[string][]map[string]any {
	t.Helper()
	out := map[string][]map[string]any{}
	for _, m := range res.Messages {
		dev := m.Device
		out[dev] = append(out[dev], batch(t, m)...)
	}
	return out
}

// TestMergeOutOfOrder covers the lines that go back in time for their
// device: a device's readings are only indexed once a line is not its
// latest, and every merge and conflict must still be found.
func TestMergeOutOfOrder(t *testing.T) {
	ns := func(s int) int64 { return now.Add(-time.Hour + time.Duration(s)*time.Second).UnixNano() }
	k := func(s int) buckets.Ticks {
		return buckets.MustTicks(now.Add(-time.Hour + time.Duration(s)*time.Second))
	}
	body := strings.Join([]string{
		fmt.Sprintf("m,device=a v=1 %d", ns(1)),
		fmt.Sprintf("m,device=b v=10 %d", ns(5)),
		fmt.Sprintf("m,device=a v=3 %d", ns(3)),
		fmt.Sprintf("m,device=a v=2 %d", ns(2)),      // back in time: a new reading between
		fmt.Sprintf("m,device=a w=1 %d", ns(1)),      // merges into the first line's reading
		fmt.Sprintf("m,device=a v=4 %d", ns(4)),      // indexed from now on: a new latest
		fmt.Sprintf("m,device=a u=4 %d", ns(4)),      // merges into it
		fmt.Sprintf("m,device=a v=9 %d", ns(3)),      // conflicts with line 3
		fmt.Sprintf("m,device=b v=11 %d", ns(5)),     // conflicts with line 2 (b never went back)
		fmt.Sprintf("m,device=b v=10,x=1 %d", ns(5)), // same value again: merges
	}, "\n")
	res := Map([]byte(body), opts())
	require.Len(t, res.Rejected, 2)
	assert.Equal(t, 8, res.Rejected[0].Line)
	assert.Equal(t, CodeConflictingLines, res.Rejected[0].Err.Code)
	assert.Contains(t, res.Rejected[0].Error(), "line 3 gives")
	assert.Equal(t, 9, res.Rejected[1].Line)
	assert.Equal(t, CodeConflictingLines, res.Rejected[1].Err.Code)
	assert.Contains(t, res.Rejected[1].Error(), "line 2 gives")
	got := readingsOf(t, res)
	assert.Equal(t, []map[string]any{
		{"ts": k(1), "values": map[string]any{"m_v": 1.0, "m_w": 1.0}},
		{"ts": k(2), "values": map[string]any{"m_v": 2.0}},
		{"ts": k(3), "values": map[string]any{"m_v": 3.0}},
		{"ts": k(4), "values": map[string]any{"m_u": 4.0, "m_v": 4.0}},
	}, got["a"], "readings in time order, merged")
	assert.Equal(t, []map[string]any{{"ts": k(5), "values": map[string]any{"m_v": 10.0, "m_x": 1.0}}}, got["b"])
	assert.Equal(t, 5, res.Readings)
}

// TestValueOrderFollowsNames covers the value order kept from the
// previous line: lines giving the same keys in another order, another
// count, a duplicate after a clean line of the same count, and a
// measurement change (tags as values, so that they take part).
func TestValueOrderFollowsNames(t *testing.T) {
	at := now.Add(-time.Minute).UnixNano()
	body := strings.Join([]string{
		fmt.Sprintf("m,device=a,site=s z=1,a=2i %d", at),
		fmt.Sprintf("m,device=a,site=t z=3,a=4i %d", at+100),
		fmt.Sprintf("m,device=a,site=u a=5i,z=6 %d", at+200),
		fmt.Sprintf("m,device=a,site=v a=7i,z=8 %d", at+300),
		fmt.Sprintf("m,device=a,site=w a=9i,site=1 %d", at+400), // a tag and a field named alike
		fmt.Sprintf("m,device=a,site=x a=10i,z=11 %d", at+500),
		fmt.Sprintf("n,device=a,site=y a=12i,z=13 %d", at+600),
		fmt.Sprintf("n,device=a z=14 %d", at+700),
	}, "\n")
	o := opts()
	o.Tags = linemsg.TagsAsValues
	res := Map([]byte(body), o)
	require.Len(t, res.Rejected, 1)
	assert.Equal(t, 5, res.Rejected[0].Line)
	assert.Equal(t, buckets.CodeDuplicateValue, res.Rejected[0].Err.Code)
	var got []map[string]any
	for _, r := range readingsOf(t, res)["a"] {
		got = append(got, r["values"].(map[string]any))
	}
	assert.Equal(t, []map[string]any{
		{"m_z": 1.0, "m_a": int64(2), "m_site": "s"},
		{"m_z": 3.0, "m_a": int64(4), "m_site": "t"},
		{"m_a": int64(5), "m_z": 6.0, "m_site": "u"},
		{"m_a": int64(7), "m_z": 8.0, "m_site": "v"},
		{"m_a": int64(10), "m_z": 11.0, "m_site": "x"},
		{"n_a": int64(12), "n_z": 13.0, "n_site": "y"},
		{"n_z": 14.0},
	}, got)
}

// TestMapReusesNothingVisible maps requests one after the other (the
// mappers are pooled) and checks each result against a fresh mapping
// of the same body done first.
func TestMapReusesNothingVisible(t *testing.T) {
	bodies := [][]byte{
		benchBody(),
		[]byte("m,device=a v=1 1795309323000000000\nm,device=a v=2 1795309323000000000\n"),
		[]byte("x,host=h1 s=\"a\" 1795309323000000000\nx,host=h1,device=d s=\"b\" 1795309323000000000\nbad\n"),
		[]byte("m,device=a,fleet=East v=1 1795309323000000000\nm,device=b,fleet=West,site=x v=2 1795309323000000000\nm,device=a,fleet=North v=3 1795309324000000000\n"),
		benchBody()[:20000],
	}
	var want []linemsg.Result
	for _, b := range bodies {
		want = append(want, Map(b, opts()))
	}
	for range 3 {
		for i, b := range bodies {
			assert.Equal(t, want[i], Map(b, opts()), "body %d", i)
		}
	}
	// Requests mapped at the same time share nothing.
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 20 {
				b := (g + i) % len(bodies)
				assert.Equal(t, want[b], Map(bodies[b], opts()), "body %d", b)
			}
		})
	}
	wg.Wait()
	// What a result holds stays as it was while later requests map.
	first := Map(bodies[0], opts())
	data := append([]byte(nil), first.Messages[0].Data...)
	for _, b := range bodies {
		Map(b, opts())
	}
	assert.Equal(t, data, first.Messages[0].Data)
}

func TestParseInt(t *testing.T) {
	cases := []string{"", "+", "-", "0", "-0", "+0", "1", "-1", "007", "1795309323000000000",
		"9223372036854775807", "9223372036854775808", "-9223372036854775808", "-9223372036854775809",
		"92233720368547758070", "18446744073709551616", "99999999999999999999999", "1_000", "1e3", "0x10",
		" 1", "1 ", "--1", "+-1", "1.5", "١"}
	r := rand.New(rand.NewPCG(1, 2))
	for range 10000 {
		cases = append(cases, strconv.FormatInt(int64(r.Uint64()), 10), strconv.FormatUint(r.Uint64(), 10))
	}
	for _, s := range cases {
		want, err := strconv.ParseInt(s, 10, 64)
		got, ok := parseInt([]byte(s))
		assert.Equal(t, err == nil, ok, "%q", s)
		if err == nil {
			assert.Equal(t, want, got, "%q", s)
		}
	}
}

func FuzzParseInt(f *testing.F) {
	for _, s := range []string{"0", "-9223372036854775808", "9223372036854775808", "+1", "1_0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		want, err := strconv.ParseInt(s, 10, 64)
		got, ok := parseInt([]byte(s))
		if ok != (err == nil) || (ok && got != want) {
			t.Fatalf("%q: parseInt %d %v, strconv %d %v", s, got, ok, want, err)
		}
	})
}

func TestUnixNanoTicks(t *testing.T) {
	ns := []int64{0, 1, -1, 99, 100, 101, -99, -100, -101, math.MaxInt64, math.MinInt64, 1795309323123456789, -1795309323123456789}
	r := rand.New(rand.NewPCG(3, 4))
	for range 10000 {
		ns = append(ns, int64(r.Uint64()))
	}
	for _, n := range ns {
		want, err := buckets.TicksOf(time.Unix(0, n))
		require.NoError(t, err)
		assert.Equal(t, want, unixNanoTicks(n), "%d", n)
	}
}

// TestMergeKeepsTheLineOfEachValue merges several lines into one
// reading: each value remembers the line that gave it, so that a later
// conflict names that line, and a value given again merges.
func TestMergeKeepsTheLineOfEachValue(t *testing.T) {
	at := now.Add(-time.Minute)
	ns := at.UnixNano()
	body := strings.Join([]string{
		fmt.Sprintf("m,device=a b=1 %d", ns),
		fmt.Sprintf("m,device=a d=2 %d", ns),
		fmt.Sprintf("m,device=a a=3,c=4 %d", ns),
		fmt.Sprintf("m,device=a b=9 %d", ns),
		fmt.Sprintf("m,device=a d=9 %d", ns),
		fmt.Sprintf("m,device=a c=9 %d", ns),
		fmt.Sprintf("m,device=a a=3,e=5 %d", ns),
		fmt.Sprintf("m,device=a e=6 %d", ns),
	}, "\n")
	res := Map([]byte(body), opts())
	require.Len(t, res.Rejected, 4)
	for i, want := range []struct{ line, earlier int }{{4, 1}, {5, 2}, {6, 3}, {8, 7}} {
		assert.Equal(t, want.line, res.Rejected[i].Line)
		assert.Equal(t, CodeConflictingLines, res.Rejected[i].Err.Code)
		assert.Contains(t, res.Rejected[i].Error(), fmt.Sprintf("line %d gives", want.earlier))
	}
	assert.Equal(t, []map[string]any{{"ts": buckets.MustTicks(at), "values": map[string]any{
		"m_a": 3.0, "m_b": 1.0, "m_c": 4.0, "m_d": 2.0, "m_e": 5.0}}}, readingsOf(t, res)["a"])
}

// TestMergeInPlace covers a device's second line of a time merging
// into the room its reading was given (as many values as the device's
// previous merge added): values in name order whichever line gave them,
// each still naming its line in a conflict, the readings of the other
// device beside them in the arena untouched, and a merge that adds more
// than the room going into a copy.
func TestMergeInPlace(t *testing.T) {
	ns := func(s int) int64 { return now.Add(-time.Hour + time.Duration(s)*time.Second).UnixNano() }
	k := func(s int) buckets.Ticks {
		return buckets.MustTicks(now.Add(-time.Hour + time.Duration(s)*time.Second))
	}
	body := strings.Join([]string{
		fmt.Sprintf("m,device=a x=1,z=3 %d", ns(1)),
		fmt.Sprintf("m,device=b x=10 %d", ns(1)),
		fmt.Sprintf("m,device=a y=2,z=3 %d", ns(1)),     // adds 1: a's next reading gets room for 1
		fmt.Sprintf("m,device=a x=4,z=6 %d", ns(2)),     // line 4
		fmt.Sprintf("m,device=b x=11 %d", ns(2)),        // right after a's reading and its room
		fmt.Sprintf("m,device=a w=0,y=5,z=6 %d", ns(2)), // adds 2, more than the room: a copy
		fmt.Sprintf("m,device=a x=7,z=9 %d", ns(3)),     // line 7, room for 2
		fmt.Sprintf("m,device=b x=12 %d", ns(3)),
		fmt.Sprintf("m,device=a y=8 %d", ns(3)), // line 9, in place at the middle
		fmt.Sprintf("m,device=a a=1 %d", ns(3)), // line 10, in place at the front
		fmt.Sprintf("m,device=a x=0 %d", ns(3)), // conflicts with line 7
		fmt.Sprintf("m,device=a y=0 %d", ns(3)), // conflicts with line 9
		fmt.Sprintf("m,device=a a=0 %d", ns(3)), // conflicts with line 10
		fmt.Sprintf("m,device=a z=9 %d", ns(3)), // the same value again: merges
		fmt.Sprintf("m,device=a q=1 %d", ns(3)), // past the room: a copy
		fmt.Sprintf("m,device=a x=5 %d", ns(2)), // conflicts with line 4, after the copy
	}, "\n")
	res := Map([]byte(body), opts())
	require.Len(t, res.Rejected, 4)
	for i, want := range []struct{ line, earlier int }{{11, 7}, {12, 9}, {13, 10}, {16, 4}} {
		assert.Equal(t, want.line, res.Rejected[i].Line)
		assert.Equal(t, CodeConflictingLines, res.Rejected[i].Err.Code)
		assert.Contains(t, res.Rejected[i].Error(), fmt.Sprintf("line %d gives", want.earlier))
	}
	got := readingsOf(t, res)
	assert.Equal(t, []map[string]any{
		{"ts": k(1), "values": map[string]any{"m_x": 1.0, "m_y": 2.0, "m_z": 3.0}},
		{"ts": k(2), "values": map[string]any{"m_w": 0.0, "m_x": 4.0, "m_y": 5.0, "m_z": 6.0}},
		{"ts": k(3), "values": map[string]any{"m_a": 1.0, "m_q": 1.0, "m_x": 7.0, "m_y": 8.0, "m_z": 9.0}},
	}, got["a"])
	assert.Equal(t, []map[string]any{
		{"ts": k(1), "values": map[string]any{"m_x": 10.0}},
		{"ts": k(2), "values": map[string]any{"m_x": 11.0}},
		{"ts": k(3), "values": map[string]any{"m_x": 12.0}},
	}, got["b"])
}

// TestMapAll maps a body of good lines as Map does, and gives up,
// holding nothing, on a body with a bad line.
func TestMapAll(t *testing.T) {
	o := opts()
	o.DeviceTags = []string{"name"}
	body := tsbsBody(2000, 100)
	all, ok := MapAll(body, o)
	require.True(t, ok)
	assert.Equal(t, Map(body, o), all)
	assert.Len(t, all.Messages, 100, "one message per truck")
	assert.Equal(t, 2000, all.Lines)

	bad := append(body[:len(body):len(body)], "readings,name=truck_1 velocity= 1\n"...)
	res, ok := MapAll(bad, o)
	assert.False(t, ok)
	assert.Equal(t, linemsg.Result{}, res)
	assert.Len(t, Map(bad, o).Rejected, 1)
}

// TestIdleMappersAreBounded covers the mappers kept between requests:
// at most GOMAXPROCS, the next request takes one of them, and a mapper
// past the bound is left to the GC.
func TestIdleMappersAreBounded(t *testing.T) {
	for len(idleMappers.ms) > 0 { // what earlier tests left
		getMapper()
	}
	n := maxIdleMappers()
	var ms []*mapper
	for range n + 2 {
		ms = append(ms, newMapper(opts(), 10, 100))
	}
	for _, m := range ms {
		m.release()
	}
	require.Len(t, idleMappers.ms, n)
	kept := map[*mapper]bool{}
	for _, m := range idleMappers.ms {
		kept[m] = true
	}
	assert.True(t, kept[ms[0]], "the first ones released are kept")
	assert.False(t, kept[ms[n]], "a mapper past the bound is not kept")
	m := newMapper(opts(), 10, 100)
	assert.True(t, kept[m], "the next request takes a kept mapper")
	assert.Len(t, idleMappers.ms, n-1)
	m.release()
	assert.Len(t, idleMappers.ms, n)
}
