package lineproto

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
)

var now = time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)

func opts() linemsg.Options {
	return linemsg.Options{DeviceTags: []string{"device", "host"}, Precision: time.Nanosecond,
		Now: now, Window: buckets.Window{Retention: 720 * time.Hour, MaxFutureSkew: 5 * time.Minute}}
}

// batch decodes one published message as the ingester does: its
// readings as {"ts": ticks, "values": {name: value}}.
func batch(t *testing.T, m linemsg.Message) []map[string]any {
	t.Helper()
	require.Equal(t, wire.Format, m.Header[wire.Header])
	require.False(t, m.DeadLetter)
	rs, _, err := wire.Decode(buckets.DeviceID(m.Device), m.Data)
	require.NoError(t, err)
	var out []map[string]any
	for _, r := range rs {
		require.NoError(t, r.Validate())
		values := map[string]any{}
		for _, f := range r.Values {
			values[f.Name] = f.Value.Any()
		}
		out = append(out, map[string]any{"ts": r.Ticks, "values": values})
	}
	return out
}

// assignments decodes the attribute assignments of one published
// message.
func assignments(t *testing.T, m linemsg.Message) []buckets.Assignment {
	t.Helper()
	_, as, err := wire.Decode(buckets.DeviceID(m.Device), m.Data)
	require.NoError(t, err)
	return as
}

func attrs(kv ...string) buckets.Attributes {
	var a buckets.Attributes
	for i := 0; i < len(kv); i += 2 {
		a = append(a, buckets.Attribute{Name: kv[i], Value: kv[i+1]})
	}
	return a
}

func TestSplitLines(t *testing.T) {
	body := "# comment\n\n  \r\nm,device=a s=\"x\ny\" 1\r\nm,device=b v=1\n   # indented comment\nm,device=c v=\"a\\\"\nb\"\nlast v=1"
	var got []string
	var nums []int
	for l := range splitLines([]byte(body)) {
		got = append(got, string(l.text))
		nums = append(nums, l.number)
	}
	assert.Equal(t, []string{"m,device=a s=\"x\ny\" 1", "m,device=b v=1", "m,device=c v=\"a\\\"\nb\"", "last v=1"}, got)
	assert.Equal(t, []int{4, 6, 8, 10}, nums, "entries are numbered by the physical line they start on")
}

func TestDeviceTagPriority(t *testing.T) {
	o := opts()
	res := Map([]byte("m,host=h1,device=d1,site=s v=1 1795309323000000000\nm,host=h2 v=2 1795309323000000000\n"), o)
	require.Empty(t, res.Rejected)
	require.Len(t, res.Messages, 2)
	assert.Equal(t, "d1", res.Messages[0].Device, "device outranks host whatever the tag order")
	assert.Equal(t, map[string]any{"m_v": 1.0}, batch(t, res.Messages[0])[0]["values"])
	assert.Equal(t, []buckets.Assignment{{Device: "d1", At: 639309061230000000, Set: attrs("host", "h1", "site", "s")}},
		assignments(t, res.Messages[0]), "the lower-ranked device tag is an attribute too")
	assert.Equal(t, "h2", res.Messages[1].Device)
	assert.Nil(t, assignments(t, res.Messages[1]))

	o.Tags = linemsg.TagsAsValues
	res = Map([]byte("m,host=h1,device=d1,site=s v=1 1795309323000000000\n"), o)
	require.Empty(t, res.Rejected)
	assert.Equal(t, map[string]any{"m_v": 1.0, "m_host": "h1", "m_site": "s"}, batch(t, res.Messages[0])[0]["values"])
	assert.Nil(t, assignments(t, res.Messages[0]))

	o.DeviceTags = []string{"sensor"}
	res = Map([]byte("m,device=d1 v=1\n"), o)
	require.Len(t, res.Rejected, 1)
	assert.Equal(t, buckets.CodeInvalidDevice, res.Rejected[0].Err.Code)
	assert.True(t, res.DeadLetters[0].DeadLetter)
	assert.Empty(t, res.DeadLetters[0].Device, "a dead letter of a line without a device has none")

	res = Map([]byte("m,device=bad.id v=1\n"), opts())
	require.Len(t, res.Rejected, 1)
	assert.Equal(t, buckets.CodeInvalidDevice, res.Rejected[0].Err.Code)
	assert.Contains(t, res.Rejected[0].Error(), "line 1: tag device:")
}

func TestFloatsStayFloats(t *testing.T) {
	res := Map([]byte("m,device=a f=1,g=-0,h=1e21,i=1i 1795309323000000000\n"), opts())
	require.Empty(t, res.Rejected)
	values := batch(t, res.Messages[0])[0]["values"].(map[string]any)
	assert.Equal(t, map[string]any{"m_f": 1.0, "m_g": math.Copysign(0, -1), "m_h": 1e21, "m_i": int64(1)}, values)
	assert.True(t, math.Signbit(values["m_g"].(float64)), "-0 keeps its sign")
}

func TestMessagesSplitByCountAndBytes(t *testing.T) {
	var b strings.Builder
	for i := range buckets.MaxBatch + 1 {
		fmt.Fprintf(&b, "m,device=a v=%di %d\n", i, now.Add(-time.Hour+time.Duration(i)*time.Microsecond).UnixNano())
	}
	res := Map([]byte(b.String()), opts())
	require.Len(t, res.Messages, 2)
	assert.Len(t, batch(t, res.Messages[0]), buckets.MaxBatch)
	assert.Len(t, batch(t, res.Messages[1]), 1)
	assert.Equal(t, buckets.MaxBatch+1, res.Readings)

	o := opts()
	o.MaxMessageBytes = 500
	res = Map([]byte(b.String()[:20000]), o)
	total := 0
	for _, m := range res.Messages {
		assert.LessOrEqual(t, len(m.Data), 500)
		total += len(batch(t, m))
	}
	assert.Equal(t, res.Readings, total)
	assert.Greater(t, len(res.Messages), 10)
}

func TestMsgIDsAreDeterministic(t *testing.T) {
	body := []byte("m,device=a v=1 1795309323000000000\nm,device=b v=x\n")
	r1, r2 := Map(body, opts()), Map(body, opts())
	require.Len(t, r1.Messages, 1)
	assert.Empty(t, r1.Messages[0].MsgID, "readings merge by device and time: they need no ID")
	assert.NotEmpty(t, r1.DeadLetters[0].MsgID)
	assert.Equal(t, r1.DeadLetters[0].MsgID, r2.DeadLetters[0].MsgID)
	r3 := Map([]byte("m,device=a v=2 1795309323000000000\nm,device=b v=y\n"), opts())
	assert.NotEqual(t, r1.DeadLetters[0].MsgID, r3.DeadLetters[0].MsgID)
}

func TestTimestampLimits(t *testing.T) {
	o := opts()
	o.Precision = time.Hour
	res := Map([]byte("m,device=a v=1 9223372036854775807\nm,device=a v=1 x\n"), o)
	require.Len(t, res.Rejected, 2)
	assert.Equal(t, buckets.CodeInvalidTime, res.Rejected[0].Err.Code)
	assert.Contains(t, res.Rejected[0].Error(), "out of range")
	assert.Equal(t, buckets.CodeInvalidPayload, res.Rejected[1].Err.Code)
}

// A zero Precision is nanoseconds, as both write APIs default to; it
// once divided by zero.
func TestZeroPrecisionIsNanoseconds(t *testing.T) {
	body := []byte("m,device=a v=1 1795309323000000000\n")
	want := Map(body, opts())
	o := opts()
	o.Precision = 0
	got := Map(body, o)
	require.Empty(t, got.Rejected)
	require.Len(t, got.Messages, 1)
	assert.Equal(t, batch(t, want.Messages[0]), batch(t, got.Messages[0]))
}

func TestTooManyValuesAfterMerge(t *testing.T) {
	var b strings.Builder
	for i := range buckets.MaxValues + 1 {
		fmt.Fprintf(&b, "m,device=a v%d=1 1795309323000000000\n", i)
	}
	res := Map([]byte(b.String()), opts())
	require.Len(t, res.Rejected, 1)
	assert.Equal(t, buckets.MaxValues+1, res.Rejected[0].Line)
	assert.Equal(t, buckets.CodeTooManyValues, res.Rejected[0].Err.Code)
	assert.Len(t, batch(t, res.Messages[0])[0]["values"], buckets.MaxValues)
}

func FuzzMap(f *testing.F) {
	f.Add([]byte("m,device=a v=1 1795309323000000000\n"))
	f.Add([]byte("m,device=a s=\"x\ny\",b=t,u=1u,i=-1i 1\r\n# c\n"))
	f.Add([]byte("m\\ x,device=a\\,b v=1\nbad line\n"))
	f.Add([]byte("m,device=a s=\"x\ny\",v=1i 1795309323000000000\n\n# c\nm,device=b v=2 1795309323000000000\nm,device=a s=\"z\" 1795309323000000000\n"))
	f.Add([]byte("m,device=a,fleet=East,model=F v=1 1795309323000000000\nm,device=a,fleet=West v=2 1795309323000000000\nm,device=a,x.y=1 v=3\n"))
	f.Fuzz(func(t *testing.T, body []byte) {
		mode := linemsg.TagsAsAttributes
		if len(body)%2 == 1 {
			mode = linemsg.TagsAsValues
		}
		o := opts()
		o.Tags = mode
		res := Map(body, o)
		var entries []rawLine
		for l := range splitLines(body) {
			entries = append(entries, l)
		}
		o.MaxMessageBytes = linemsg.DefaultMaxMessageBytes
		slow := mapEach(o, entries).finish(len(entries))
		assert.Equal(t, slow, res, "one decoder for the body and one per line must agree")
		assert.Len(t, res.DeadLetters, len(res.Rejected))
		n := 0
		for _, m := range res.Messages {
			n += len(batch(t, m))
		}
		assert.Equal(t, res.Readings, n)
	})
}

// The measurement and a field join with linemsg.Options.NameSeparator: _ by
// default (climate_temp, which PromQL writes plainly), . when asked
// (climate.temp, the names of earlier releases). Tags as values join
// the same way.
func TestNameSeparator(t *testing.T) {
	line := []byte("climate,device=boiler-7,room=kitchen temp=21.5 1795309323000000000\n")
	for _, tc := range []struct {
		sep         byte
		attrs, vals map[string]any
	}{
		{0, map[string]any{"climate_temp": 21.5}, map[string]any{"climate_temp": 21.5, "climate_room": "kitchen"}},
		{'_', map[string]any{"climate_temp": 21.5}, map[string]any{"climate_temp": 21.5, "climate_room": "kitchen"}},
		{'.', map[string]any{"climate.temp": 21.5}, map[string]any{"climate.temp": 21.5, "climate.room": "kitchen"}},
	} {
		o := opts()
		o.NameSeparator = tc.sep
		res := Map(line, o)
		require.Empty(t, res.Rejected)
		assert.Equal(t, tc.attrs, batch(t, res.Messages[0])[0]["values"], "separator %q", tc.sep)
		o.Tags = linemsg.TagsAsValues
		res = Map(line, o)
		require.Empty(t, res.Rejected)
		assert.Equal(t, tc.vals, batch(t, res.Messages[0])[0]["values"], "separator %q, tags as values", tc.sep)
	}

	for _, s := range []string{"_", "."} {
		b, err := linemsg.ParseNameSeparator(s)
		require.NoError(t, err)
		assert.Equal(t, s[0], b)
	}
	for _, s := range []string{"", "-", "__", ":", "/"} {
		_, err := linemsg.ParseNameSeparator(s)
		assert.EqualError(t, err, fmt.Sprintf(`%q: want "_" or "."`, s))
	}
}

// With _ two measurement and field pairs can join to one name (cpu +
// usage_idle, cpu_usage + idle): they are one value. At one device and
// time a different value conflicts and the later line is rejected; with
// . they stay apart.
func TestNameSeparatorCollisions(t *testing.T) {
	body := []byte("cpu,device=a usage_idle=1 1795309323000000000\ncpu_usage,device=a idle=2 1795309323000000000\n")
	res := Map(body, opts())
	require.Len(t, res.Rejected, 1)
	assert.Equal(t, 2, res.Rejected[0].Line)
	assert.Equal(t, CodeConflictingLines, res.Rejected[0].Err.Code)
	assert.Equal(t, map[string]any{"cpu_usage_idle": 1.0}, batch(t, res.Messages[0])[0]["values"])

	o := opts()
	o.NameSeparator = '.'
	res = Map(body, o)
	require.Empty(t, res.Rejected)
	assert.Equal(t, map[string]any{"cpu.usage_idle": 1.0, "cpu_usage.idle": 2.0}, batch(t, res.Messages[0])[0]["values"])
}
