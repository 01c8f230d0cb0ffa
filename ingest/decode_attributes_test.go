package ingest

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

func attrs(kv ...string) buckets.Attributes {
	var a buckets.Attributes
	for i := 0; i < len(kv); i += 2 {
		a = append(a, buckets.Attribute{Name: kv[i], Value: kv[i+1]})
	}
	return a
}

func TestDecodeAttributes(t *testing.T) {
	tests := []struct {
		name     string
		payload  string
		readings []buckets.Reading
		want     []buckets.Assignment
	}{
		{"flat form", `{"ts":1795309323456,"temp":21.5,"attributes":{"model":"F-150","fleet":"East"}}`,
			[]buckets.Reading{reading(exampleTicks, "temp", 21.5)},
			[]buckets.Assignment{{Device: "dev-1", At: exampleTicks, Set: attrs("fleet", "East", "model", "F-150")}}},
		{"nested form, attributes before ts", `{"attributes":{"fleet":"East"},"values":{"v":1},"ts":1795309323456}`,
			[]buckets.Reading{reading(exampleTicks, "v", 1)},
			[]buckets.Assignment{{Device: "dev-1", At: exampleTicks, Set: attrs("fleet", "East")}}},
		{"no ts: the stream's time", `{"v":1,"attributes":{"fleet":"East"}}`,
			[]buckets.Reading{reading(defaultTicks, "v", 1)},
			[]buckets.Assignment{{Device: "dev-1", At: defaultTicks, Set: attrs("fleet", "East")}}},
		{"on some elements of a batch", `[{"ts":1795309323456,"v":1},{"ts":1795309323457,"v":2,"attributes":{"fleet":"West"}},` +
			`{"ts":1795309323458,"v":3,"attributes":{"fleet":"East","site":"b\u00e9"}}]`,
			[]buckets.Reading{reading(exampleTicks, "v", 1), reading(exampleTicks+10000, "v", 2), reading(exampleTicks+20000, "v", 3)},
			[]buckets.Assignment{{Device: "dev-1", At: exampleTicks + 10000, Set: attrs("fleet", "West")},
				{Device: "dev-1", At: exampleTicks + 20000, Set: attrs("fleet", "East", "site", "bé")}}},
		{"empty object assigns nothing", `{"v":1,"attributes":{}}`, []buckets.Reading{reading(defaultTicks, "v", 1)}, nil},
		{"values may be named attributes inside values", `{"values":{"attributes":1}}`,
			[]buckets.Reading{reading(defaultTicks, "attributes", 1)}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, as, err := Decode("dev-1", []byte(tt.payload), defaultTicks)
			require.NoError(t, err)
			assert.Equal(t, tt.readings, rs)
			assert.Equal(t, tt.want, as)
		})
	}
}

func TestDecodeRejectsAttributes(t *testing.T) {
	long := strings.Repeat("v", buckets.MaxAttributeValueBytes+1)
	tests := []struct {
		name    string
		payload string
		code    buckets.Code
		index   int
		field   string
		msg     string
	}{
		{"not an object", `{"v":1,"attributes":"East"}`, buckets.CodeInvalidAttributeValue, 0, "attributes", "got a string"},
		{"an array", `{"v":1,"attributes":["East"]}`, buckets.CodeInvalidAttributeValue, 0, "attributes", "got an array"},
		{"a number value", `{"v":1,"attributes":{"fleet":7}}`, buckets.CodeInvalidAttributeValue, 0, "attributes.fleet", "must be a string, got a number"},
		{"a null value", `{"v":1,"attributes":{"fleet":null}}`, buckets.CodeInvalidAttributeValue, 0, "attributes.fleet", "got null"},
		{"a bool value", `{"v":1,"attributes":{"fleet":true}}`, buckets.CodeInvalidAttributeValue, 0, "attributes.fleet", "got a boolean"},
		{"an object value", `{"v":1,"attributes":{"fleet":{}}}`, buckets.CodeInvalidAttributeValue, 0, "attributes.fleet", "got an object"},
		{"empty value", `{"v":1,"attributes":{"fleet":""}}`, buckets.CodeInvalidAttributeValue, 0, "attributes.fleet", "empty"},
		{"value too long", `{"v":1,"attributes":{"fleet":"` + long + `"}}`, buckets.CodeInvalidAttributeValue, 0, "attributes.fleet", "257 bytes"},
		{"value not UTF-8", "{\"v\":1,\"attributes\":{\"fleet\":\"\xff\"}}", buckets.CodeInvalidAttributeValue, 0, "attributes.fleet", "UTF-8"},
		{"name with a dot", `{"v":1,"attributes":{"a.b":"x"}}`, buckets.CodeInvalidAttributeName, 0, "attributes.a.b", "must match"},
		{"name starting with a digit", `{"v":1,"attributes":{"1a":"x"}}`, buckets.CodeInvalidAttributeName, 0, "attributes.1a", "must match"},
		{"name device", `{"v":1,"attributes":{"device":"x"}}`, buckets.CodeInvalidAttributeName, 0, "attributes.device", "names the device"},
		{"reserved name", `{"v":1,"attributes":{"__name__":"x"}}`, buckets.CodeInvalidAttributeName, 0, "attributes.__name__", "reserved"},
		{"empty name", `{"v":1,"attributes":{"":"x"}}`, buckets.CodeInvalidAttributeName, 0, "attributes", "empty"},
		{"name too long", `{"v":1,"attributes":{"` + strings.Repeat("n", 65) + `":"x"}}`, buckets.CodeInvalidAttributeName, 0,
			"attributes." + strings.Repeat("n", 16) + "...", "65 bytes"},
		{"name twice", `{"v":1,"attributes":{"b":"x","a":"y","b":"z"}}`, buckets.CodeInvalidAttributeName, 0, "attributes.b", "more than once"},
		{"key twice", `{"v":1,"attributes":{"a":"x"},"attributes":{"b":"y"}}`, buckets.CodeInvalidPayload, 0, "attributes", "more than once"},
		{"second reading of a batch", `[{"v":1},{"v":2,"attributes":{"a":1}}]`, buckets.CodeInvalidAttributeValue, 1, "attributes.a", "must be a string"},
		{"without values", `{"attributes":{"fleet":"East"}}`, buckets.CodeNoValues, 0, "values", ""},
		{"65 attributes", `{"v":1,"attributes":{` + attrMembers(0, buckets.MaxAttributes+1) + `}}`, buckets.CodeTooManyAttributes, 0, "attributes", "more than 64"},
		{"65 attributes over a batch", `[{"v":1,"attributes":{` + attrMembers(0, 40) + `}},{"v":2,"attributes":{` + attrMembers(30, 65) + `}}]`,
			buckets.CodeTooManyAttributes, -1, "attributes", "name 65 attributes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rs, as, err := Decode("dev-1", []byte(tt.payload), defaultTicks)
			requireInvalid(t, err, tt.code, tt.index, tt.field)
			assert.Contains(t, err.Error(), tt.msg)
			assert.Nil(t, rs)
			assert.Nil(t, as)
		})
	}
}

// Each attribute limit holds at its boundary.
func TestDecodeAttributeLimitsAccepted(t *testing.T) {
	name := strings.Repeat("n", buckets.MaxAttributeNameBytes)
	value := strings.Repeat("é", buckets.MaxAttributeValueBytes/2)
	_, as, err := Decode("dev-1", []byte(`{"v":1,"attributes":{"`+name+`":"`+value+`"}}`), defaultTicks)
	require.NoError(t, err)
	assert.Equal(t, attrs(name, value), as[0].Set)

	_, as, err = Decode("dev-1", []byte(`{"v":1,"attributes":{`+attrMembers(0, buckets.MaxAttributes)+`}}`), defaultTicks)
	require.NoError(t, err)
	assert.Len(t, as[0].Set, buckets.MaxAttributes)

	// 64 names over a batch, some given twice.
	_, as, err = Decode("dev-1", []byte(`[{"v":1,"attributes":{`+attrMembers(0, 40)+`}},{"v":2,"attributes":{`+attrMembers(30, 64)+`}}]`), defaultTicks)
	require.NoError(t, err)
	require.Len(t, as, 2)
	assert.Len(t, as[1].Set, 34)
}

// attrMembers is the members "a<from>":"x",... up to to, exclusive.
func attrMembers(from, to int) string {
	var b strings.Builder
	for i := from; i < to; i++ {
		if i > from {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"a%02d":"x"`, i)
	}
	return b.String()
}
