package buckets_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/buckets"
)

// requireInvalid asserts err is a *ValidationError with code and field,
// that matches ErrInvalidReading and whose message contains msg.
func requireInvalid(t *testing.T, err error, code buckets.Code, field, msg string) *buckets.ValidationError {
	t.Helper()
	require.Error(t, err)
	var ve *buckets.ValidationError
	require.ErrorAs(t, err, &ve)
	assert.Equal(t, code, ve.Code)
	assert.Equal(t, field, ve.Field)
	assert.ErrorIs(t, err, buckets.ErrInvalidReading)
	if field != "" {
		assert.Contains(t, err.Error(), field+": ")
	}
	assert.Contains(t, err.Error(), msg)
	return ve
}

func isAlnum(c byte) bool {
	return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9')
}

func TestDeviceIDValid(t *testing.T) {
	for _, s := range []string{
		"a", "Z", "0", "9", "dev-1", "A_b-9", "a_", "a-", "0--__",
		strings.Repeat("x", 64),
		"9" + strings.Repeat("-_", 31) + "z",
	} {
		d, err := buckets.ParseDeviceID(s)
		require.NoError(t, err, "%q", s)
		assert.Equal(t, buckets.DeviceID(s), d)
	}
}

func TestDeviceIDInvalid(t *testing.T) {
	tests := []struct {
		in, msg string
	}{
		{"", "must not be empty"},
		{strings.Repeat("x", 65), "65 characters is longer than 64"},
		{strings.Repeat("x", 1000), "1000 characters is longer than 64"},
		{"_a", `"_a" must start with a letter or digit`},
		{"-a", "must start with a letter or digit"},
		{".a", "must start with a letter or digit"},
		{"a.b", `"a.b" has '.' at byte 1; only A-Z a-z 0-9 _ - are allowed`},
		{"a/b", `has '/' at byte 1`},
		{"a*", `has '*' at byte 1`},
		{"a>", `has '>' at byte 1`},
		{"ab cd", `has ' ' at byte 2`},
		{"a\x00", "has byte 0x00 at byte 1"},
		{"a\n", "has byte 0x0a at byte 1"},
		{"caf\u00e9", "has byte 0xc3 at byte 3"},
		{"\u00e9", "must start with a letter or digit"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			_, err := buckets.ParseDeviceID(tc.in)
			requireInvalid(t, err, buckets.CodeInvalidDevice, "device", tc.msg)
			requireInvalid(t, buckets.DeviceID(tc.in).Validate(), buckets.CodeInvalidDevice, "device", tc.msg)
		})
	}
}

// TestDeviceIDEveryByte tries every byte as the first and as a later
// character: exactly A-Z a-z 0-9 may start an ID, and _ - may follow.
func TestDeviceIDEveryByte(t *testing.T) {
	for i := range 256 {
		c := byte(i)
		first := buckets.DeviceID([]byte{c, 'x'}).Validate()
		later := buckets.DeviceID([]byte{'x', c}).Validate()
		assert.Equal(t, isAlnum(c), first == nil, "first byte 0x%02x: %v", c, first)
		assert.Equal(t, isAlnum(c) || c == '_' || c == '-', later == nil, "later byte 0x%02x: %v", c, later)
	}
}

func TestValueNameValid(t *testing.T) {
	for _, s := range []string{
		"a", "Z", "_", "temp", "_x", "t1", "a.b-c_d", "A...", "x--", "__9",
		strings.Repeat("n", 64),
		"_" + strings.Repeat(".-", 31) + "9",
	} {
		assert.NoError(t, buckets.ValidateValueName(s), "%q", s)
	}
}

func TestValueNameInvalid(t *testing.T) {
	long := strings.Repeat("n", 65)
	tests := []struct {
		in, field, msg string
	}{
		{"", "values", "a value name must not be empty"},
		{long, "values.nnnnnnnnnnnnnnnn...", "name of 65 characters is longer than 64"},
		{"1temp", "values.1temp", "name must start with a letter or _"},
		{".a", "values..a", "name must start with a letter or _"},
		{"-a", "values.-a", "name must start with a letter or _"},
		{"a b", "values.a b", `name has ' ' at byte 1`},
		{"a/b", "values.a/b", `name has '/' at byte 1`},
		{"a:b", "values.a:b", `name has ':' at byte 1`},
		{"a\x7f", "values.a\x7f", "name has byte 0x7f at byte 1"},
		{"t\u00e9", "values.t\u00e9", "name has byte 0xc3 at byte 1"},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%q", tc.in), func(t *testing.T) {
			requireInvalid(t, buckets.ValidateValueName(tc.in), buckets.CodeInvalidName, tc.field, tc.msg)
		})
	}
}

// TestValueNameEveryByte: exactly A-Z a-z _ may start a name, and
// 0-9 . - may follow.
func TestValueNameEveryByte(t *testing.T) {
	for i := range 256 {
		c := byte(i)
		startOK := (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'
		laterOK := isAlnum(c) || c == '_' || c == '.' || c == '-'
		first := buckets.ValidateValueName(string([]byte{c, 'x'}))
		later := buckets.ValidateValueName(string([]byte{'x', c}))
		assert.Equal(t, startOK, first == nil, "first byte 0x%02x: %v", c, first)
		assert.Equal(t, laterOK, later == nil, "later byte 0x%02x: %v", c, later)
	}
}

func TestValidationErrorText(t *testing.T) {
	tests := []struct {
		err  *buckets.ValidationError
		want string
	}{
		{buckets.Invalid(buckets.CodeInvalidValue, 3, "values.temp", "%s is not a number", "NaN"), "reading 3: values.temp: NaN is not a number"},
		{buckets.Invalid(buckets.CodeInvalidTime, 0, "ts", "bad"), "reading 0: ts: bad"},
		{buckets.Invalid(buckets.CodeEmptyBatch, -1, "", "no readings"), "no readings"},
		{buckets.Invalid(buckets.CodeInvalidPayload, -1, "device", "mismatch"), "device: mismatch"},
		{buckets.Invalid(buckets.CodeBatchTooLarge, 7, "", "too big"), "reading 7: too big"},
	}
	for _, tc := range tests {
		assert.Equal(t, tc.want, tc.err.Error())
		assert.ErrorIs(t, tc.err, buckets.ErrInvalidReading)
		wrapped := fmt.Errorf("decode message: %w", tc.err)
		assert.ErrorIs(t, wrapped, buckets.ErrInvalidReading)
		var ve *buckets.ValidationError
		require.ErrorAs(t, wrapped, &ve)
		assert.Equal(t, tc.err.Code, ve.Code)
		assert.False(t, errors.Is(tc.err, buckets.ErrInvalidArgument))
	}
}
