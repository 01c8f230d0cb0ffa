package main

import (
	"flag"
	"io"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
)

// int64Fields lists the int64 fields of v (a struct, walked into its
// nested structs) by path. Every int64 of Config is a byte count.
func int64Fields(v reflect.Value, path string, out map[string]int64) {
	for i := range v.NumField() {
		f, name := v.Field(i), path+v.Type().Field(i).Name
		switch {
		case f.Kind() == reflect.Struct:
			int64Fields(f, name+".", out)
		case f.Type() == reflect.TypeFor[int64]():
			out[name] = f.Int()
		}
	}
}

// flagOf binds a fresh default Config and returns it with the flag name.
func flagOf(t *testing.T, name string) (*Config, *flag.Flag) {
	t.Helper()
	c := DefaultConfig()
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.bind(fs)
	f := fs.Lookup(name)
	require.NotNil(t, f, name)
	return &c, f
}

// TestEverySizeFlagAcceptsTheSameForms walks the service's flags: each
// one that sets a byte count (an int64 of Config) is a cliflag.ByteSize
// and accepts 512MiB, 4GiB and a plain number of bytes, as the
// environment variable does.
func TestEverySizeFlagAcceptsTheSameForms(t *testing.T) {
	inLane(t, lanes.general)
	c := DefaultConfig()
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	c.bind(fs)
	var sizes []string
	fs.VisitAll(func(f *flag.Flag) {
		cfg, fresh := flagOf(t, f.Name)
		before := map[string]int64{}
		int64Fields(reflect.ValueOf(cfg).Elem(), "", before)
		if fresh.Value.Set("12345") != nil {
			return // not a number: not a size
		}
		after := map[string]int64{}
		int64Fields(reflect.ValueOf(cfg).Elem(), "", after)
		field := ""
		for k, v := range after {
			if before[k] != v {
				field = k
			}
		}
		if field == "" {
			return // an int, a duration or a string: not a byte count
		}
		sizes = append(sizes, f.Name)
		t.Run(f.Name, func(t *testing.T) {
			assert.IsType(t, cliflag.ByteSize{}, fresh.Value, "-%s (%s) is a size flag", f.Name, field)
			for form, want := range map[string]int64{"512MiB": 512 << 20, "4GiB": 4 << 30, "1048576": 1 << 20} {
				cfg, fresh := flagOf(t, f.Name)
				require.NoError(t, fresh.Value.Set(form), "-%s %s", f.Name, form)
				got := map[string]int64{}
				int64Fields(reflect.ValueOf(cfg).Elem(), "", got)
				assert.Equal(t, want, got[field], "-%s %s", f.Name, form)
			}
		})
	})
	assert.Subset(t, sizes, []string{"max-write-bytes", "stream-max-bytes", "memory-limit", "disk-reserve"}, "the walk finds the size flags")
}
