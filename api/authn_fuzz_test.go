package api

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseAuthorization(t *testing.T) {
	basic := func(s string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(s)) }
	tests := []struct {
		header string
		influx bool
		want   string
		wantOK bool
	}{
		{"Bearer abc", false, "abc", true},
		{"bearer   abc  ", false, "abc", true},
		{"Token abc", true, "abc", true},
		{"Token abc", false, "", false},
		{basic("telegraf:abc"), true, "abc", true},
		{basic(":abc"), true, "abc", true},
		{basic("abc"), true, "", false},
		{basic("u:abc"), false, "", false},
		{"Basic !!!", true, "", false},
		{"Bearer", false, "", false},
		{"Bearer ", false, "", false},
		{"Bearer a b", false, "", false},
		{"Digest abc", true, "", false},
		{"", false, "", false},
		{"Bearer " + strings.Repeat("a", maxAuthHeader), false, "", false},
	}
	for _, tt := range tests {
		got, ok := parseAuthorization(tt.header, tt.influx)
		assert.Equal(t, tt.wantOK, ok, "%q", tt.header)
		assert.Equal(t, tt.want, got, "%q", tt.header)
	}
}

func FuzzParseAuthorization(f *testing.F) {
	for _, s := range []string{"Bearer abc", "Token abc", "Basic dTpw", "Basic " + base64.StdEncoding.EncodeToString([]byte("a:b:c")), "bearer\tx", ""} {
		f.Add(s, true)
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, h string, influx bool) {
		secret, ok := parseAuthorization(h, influx)
		if !ok {
			if secret != "" {
				t.Fatalf("secret %q returned with ok=false", secret)
			}
			return
		}
		if secret == "" || strings.ContainsAny(secret, " \t\r\n") {
			t.Fatalf("unusable secret %q accepted from %q", secret, h)
		}
		if len(h) > maxAuthHeader {
			t.Fatalf("header of %d bytes parsed", len(h))
		}
		scheme, _, _ := strings.Cut(strings.TrimSpace(h), " ")
		if !influx && !strings.EqualFold(scheme, "bearer") {
			t.Fatalf("scheme %q accepted outside the write endpoints", scheme)
		}
		if strings.EqualFold(scheme, "bearer") || strings.EqualFold(scheme, "token") {
			if !strings.Contains(h, secret) {
				t.Fatalf("secret %q is not in the header %q", secret, h)
			}
		}
	})
}
