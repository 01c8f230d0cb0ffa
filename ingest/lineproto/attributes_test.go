package lineproto

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
)

// Tags become attributes of the line's device as of the line's time:
// per attribute the latest line's value, grouped by time, in the
// device's first message; a line without a timestamp holds as of the
// request's arrival.
func TestTagsBecomeAttributes(t *testing.T) {
	ns := func(s int) int64 { return now.Add(-time.Hour + time.Duration(s)*time.Second).UnixNano() }
	k := func(s int) buckets.Ticks {
		return buckets.MustTicks(now.Add(-time.Hour + time.Duration(s)*time.Second))
	}
	body := strings.Join([]string{
		fmt.Sprintf("truck,device=t1,fleet=East,model=F-150 fuel=0.5 %d", ns(1)),
		fmt.Sprintf("truck,device=t1,fleet=West fuel=0.4 %d", ns(3)),
		fmt.Sprintf("truck,device=t1,fleet=North,site=a fuel=0.6 %d", ns(2)), // late: its fleet loses to line 2
		fmt.Sprintf("engine,device=t1,model=F-150 rpm=900i %d", ns(3)),       // merges with line 2
		"truck,device=t2,fleet=East fuel=0.9",
		fmt.Sprintf("truck,device=t3 fuel=0.1 %d", ns(1)),
	}, "\n")
	res := Map([]byte(body), opts())
	require.Empty(t, res.Rejected)
	require.Len(t, res.Messages, 3)
	for _, m := range res.Messages {
		for _, r := range batch(t, m) {
			for name := range r["values"].(map[string]any) {
				assert.NotContains(t, []string{"truck_fleet", "truck_model", "truck_site"}, name, "tags are not values")
			}
		}
	}
	assert.Equal(t, []buckets.Assignment{
		{Device: "t1", At: k(2), Set: attrs("site", "a")},
		{Device: "t1", At: k(3), Set: attrs("fleet", "West", "model", "F-150")},
	}, assignments(t, res.Messages[0]))
	assert.Equal(t, []buckets.Assignment{{Device: "t2", At: buckets.MustTicks(now), Set: attrs("fleet", "East")}},
		assignments(t, res.Messages[1]))
	assert.Nil(t, assignments(t, res.Messages[2]), "a device without tags assigns nothing")
}

// Tags that cannot be attributes reject their line, naming the tag; the
// good lines of the request are kept.
func TestTagsThatAreNotAttributes(t *testing.T) {
	var many, most strings.Builder
	for i := range buckets.MaxAttributes + 1 {
		fmt.Fprintf(&many, ",t%02d=x", i)
		if i < buckets.MaxAttributes {
			fmt.Fprintf(&most, ",t%02d=x", i)
		}
	}
	long := strings.Repeat("v", buckets.MaxAttributeValueBytes+1)
	for _, tc := range []struct {
		name, line string
		code       buckets.Code
		msg        string
		asValues   bool // accepted with linemsg.TagsAsValues
	}{
		{"dotted key", "m,device=a,k8s.pod=x v=1", buckets.CodeInvalidAttributeName, "tag k8s.pod: attribute name must match", true},
		{"dashed key", "m,device=a,rack-id=x v=1", buckets.CodeInvalidAttributeName, "tag rack-id:", true},
		{"reserved key", "m,device=a,__name__=x v=1", buckets.CodeInvalidAttributeName, "tag __name__:", true},
		{"device below host", "m,host=h1,device=d1 v=1", buckets.CodeInvalidAttributeName, `tag device: "device" names the device`, false},
		{"long value", "m,device=a,site=" + long + " v=1", buckets.CodeInvalidAttributeValue, "tag site: attribute value is 257 bytes", false},
		{"tag twice", "m,device=a,b=1,a=3,b=2 v=1", buckets.CodeInvalidAttributeName, "tag b: the line gives this tag twice", false},
		{"65 tags", "m,device=a" + many.String() + " v=1", buckets.CodeTooManyAttributes, "tags: 65 tags besides the device tag", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, good := opts(), "m,device=ok v=1\n"
			if tc.name == "device below host" {
				o.DeviceTags, good = []string{"host"}, "m,host=ok v=1\n"
			}
			res := Map([]byte(good+tc.line+"\n"), o)
			require.Len(t, res.Rejected, 1)
			assert.Equal(t, 2, res.Rejected[0].Line)
			assert.Equal(t, tc.code, res.Rejected[0].Err.Code)
			assert.Contains(t, res.Rejected[0].Error(), "line 2: "+tc.msg)
			require.Len(t, res.DeadLetters, 1)
			assert.Equal(t, tc.code, res.DeadLetters[0].Code)
			assert.Equal(t, 1, res.Readings, "the good line is kept")

			if tc.asValues {
				o.Tags = linemsg.TagsAsValues
				res = Map([]byte(tc.line+"\n"), o)
				assert.Empty(t, res.Rejected, "as values the line is fine")
			}
		})
	}
	res := Map([]byte("m,device=a"+most.String()+" v=1\n"), opts())
	require.Empty(t, res.Rejected, "64 tags are 64 attributes")
	assert.Len(t, assignments(t, res.Messages[0])[0].Set, buckets.MaxAttributes)
}

// Two lines of one device and time giving one attribute different
// values conflict; the lines of one device may name at most 64
// attributes together.
func TestAttributeConflictsAndDeviceLimit(t *testing.T) {
	at := now.Add(-time.Minute).UnixNano()
	body := strings.Join([]string{
		fmt.Sprintf("cpu,host=h1,cpu=cpu0 idle=90 %d", at),
		fmt.Sprintf("cpu,host=h1,cpu=cpu1 busy=80 %d", at),
		fmt.Sprintf("mem,host=h1,cpu=cpu0 free=1i %d", at), // the same value again: merges
		fmt.Sprintf("cpu,host=h1,cpu=cpu1 idle=70 %d", at+100),
	}, "\n")
	res := Map([]byte(body), opts())
	require.Len(t, res.Rejected, 1)
	assert.Equal(t, 2, res.Rejected[0].Line)
	assert.Equal(t, CodeConflictingLines, res.Rejected[0].Err.Code)
	assert.Contains(t, res.Rejected[0].Error(), `line 1 gives the attribute cpu the value "cpu0" at the same device and time; this line gives "cpu1"`)
	assert.Equal(t, []buckets.Assignment{{Device: "h1", At: unixNanoTicks(at + 100), Set: attrs("cpu", "cpu1")}},
		assignments(t, res.Messages[0]))

	var b strings.Builder
	for i := range buckets.MaxAttributes + 1 {
		fmt.Fprintf(&b, "m,device=a,t%02d=x v=%d %d\n", i, i, at+int64(i)*100)
	}
	res = Map([]byte(b.String()), opts())
	require.Len(t, res.Rejected, 1)
	assert.Equal(t, buckets.MaxAttributes+1, res.Rejected[0].Line)
	assert.Equal(t, buckets.CodeTooManyAttributes, res.Rejected[0].Err.Code)
	assert.Contains(t, res.Rejected[0].Error(), "65 attributes, more than 64")
	n := 0
	for _, a := range assignments(t, res.Messages[0]) {
		n += len(a.Set)
	}
	assert.Equal(t, buckets.MaxAttributes, n)
}

// A device whose readings span several messages gets its assignments in
// the first only.
func TestAssignmentsInFirstMessage(t *testing.T) {
	var b strings.Builder
	for i := range buckets.MaxBatch + 1 {
		fmt.Fprintf(&b, "m,device=a,fleet=East v=%di %d\n", i, now.Add(-time.Hour+time.Duration(i)*time.Microsecond).UnixNano())
	}
	res := Map([]byte(b.String()), opts())
	require.Len(t, res.Messages, 2)
	as := assignments(t, res.Messages[0])
	require.Len(t, as, 1)
	assert.Equal(t, attrs("fleet", "East"), as[0].Set)
	assert.Equal(t, buckets.MustTicks(now.Add(-time.Hour+time.Duration(buckets.MaxBatch)*time.Microsecond)), as[0].At,
		"as of the latest line, which is in the second message")
	assert.Nil(t, assignments(t, res.Messages[1]))
}

// Tags in an order other than by name are sorted per line; lines that
// repeat the tags of an earlier line in the same order reuse its order,
// and lines that change them do not.
func TestTagOrderPerLine(t *testing.T) {
	ns := now.Add(-time.Minute).UnixNano()
	body := strings.Join([]string{
		fmt.Sprintf("m,device=d1,z=1,a=2 v=1 %d", ns),
		fmt.Sprintf("m,device=d2,z=3,a=4 v=1 %d", ns),
		fmt.Sprintf("m,device=d3,a=5,z=6 v=1 %d", ns),
		fmt.Sprintf("m,device=d4,z=7,m=8,a=9 v=1 %d", ns),
		fmt.Sprintf("m,device=d5,z=1,a=2,a=3 v=1 %d", ns),
		fmt.Sprintf("m,device=d6,z=1,a=2 v=1 %d", ns),
		fmt.Sprintf("m,device=d6,z=1,a=3 w=1 %d", ns), // conflicts with the line before
		fmt.Sprintf("m,device=d6,z=1,a=2 w=2 %d", ns), // merges
	}, "\n")
	res := Map([]byte(body), opts())
	require.Len(t, res.Rejected, 2)
	assert.Equal(t, 5, res.Rejected[0].Line)
	assert.Equal(t, buckets.CodeInvalidAttributeName, res.Rejected[0].Err.Code)
	assert.Equal(t, 7, res.Rejected[1].Line)
	assert.Equal(t, CodeConflictingLines, res.Rejected[1].Err.Code)
	k := buckets.MustTicks(time.Unix(0, ns))
	want := map[string]buckets.Attributes{
		"d1": attrs("a", "2", "z", "1"),
		"d2": attrs("a", "4", "z", "3"),
		"d3": attrs("a", "5", "z", "6"),
		"d4": attrs("a", "9", "m", "8", "z", "7"),
		"d6": attrs("a", "2", "z", "1"),
	}
	require.Len(t, res.Messages, len(want))
	for _, m := range res.Messages {
		assert.Equal(t, []buckets.Assignment{{Device: buckets.DeviceID(m.Device), At: k, Set: want[m.Device]}}, assignments(t, m), m.Device)
	}
}
