package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"strings"
)

// errVersion is returned by the flag parsing when -version was given.
var errVersion = errors.New("version requested")

// serviceUsage heads `telemetryd -h`.
const serviceUsage = `telemetryd: telemetry ingestion service (NATS JetStream -> Badger day tables -> HTTP API)

Usage:
  telemetryd [flags]                       run the service
  telemetryd retention [-dry-run] [flags]  apply retention once to a stopped service's data dir
                                           (its flags: telemetryd retention -h)
  telemetryd check [flags]                 verify the checksum of every stored block of a
                                           stopped service's data dir (telemetryd check -h)
  telemetryd auth add-device|add-token|revoke|list [flags]
                                           edit the -auth-file (telemetryd auth -h)
  telemetryd -version                      print the version

Devices send readings (all end in the JetStream stream TELEMETRY):
  NATS   publish JSON on <prefix>.<device>             (-nats-listen)
  MQTT   3.1.1, QoS 0/1/2, JSON on topic <prefix>/<device> (-mqtt-listen)
  HTTP   InfluxDB line protocol: POST /api/v2/write, POST /write, and
         POST /query for CREATE DATABASE (-line-device-tags, -line-tags,
         -max-write-bytes)

Every flag can also be set by the environment variable named beside it;
a flag on the command line wins. OpenTelemetry export follows the
standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SDK_DISABLED, ...).

Flags:
`

// retentionUsage heads `telemetryd retention -h`.
const retentionUsage = `telemetryd retention: apply the retention policy once to the data dir of a
stopped service (a running service holds the directory; use its
POST /v1/retention/run instead). Prints one line per table and a summary.

Usage:
  telemetryd retention [-dry-run] [flags]

Every flag can also be set by the environment variable named beside it;
a flag on the command line wins.

Flags:
`

// setUsage makes fs print head, then every flag with its default and
// its environment variable.
func setUsage(fs *flag.FlagSet, head string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprint(w, head)
		printFlags(w, fs)
	}
}

// printFlags lists the flags of fs: name, type, meaning, default and
// the TELEMETRY_* variable (none for -version).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := flagType(f)
		line := "  -" + f.Name
		if typ != "" {
			line += " " + typ
		}
		if f.Name != "version" {
			line += "   [" + envName(f.Name) + "]"
		}
		fmt.Fprintln(w, line)
		fmt.Fprintf(w, "    \t%s", strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			if typ == "string" {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
		}
		fmt.Fprintln(w)
	})
}

// flagType is flag.UnquoteUsage with byte sizes named "size".
func flagType(f *flag.Flag) (typ, usage string) {
	typ, usage = flag.UnquoteUsage(f)
	if _, ok := f.Value.(byteSize); ok {
		typ = "size"
	}
	return typ, usage
}

// version describes the binary: module version, VCS revision and time
// when the build recorded them, and the Go version.
func version() string {
	v, rev, at, dirty := "(devel)", "", "", false
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				at = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
	}
	out := "telemetryd " + v
	if rev != "" {
		out += " " + rev[:min(12, len(rev))]
		if dirty {
			out += "-dirty"
		}
		if at != "" {
			out += " " + at
		}
	}
	return out + " " + runtime.Version()
}
