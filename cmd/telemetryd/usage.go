package main

import (
	"errors"
	"flag"
	"fmt"

	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
	"github.com/telemetryd/telemetryd/cmd/internal/flagdoc"
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
  telemetryd repair -day D [-backup DIR]   rebuild a damaged day table of a stopped data dir
                                           (telemetryd repair -h)
  telemetryd export -url URL|-data-dir D [flags]
                                           write readings as NDJSON or CSV from a running
                                           service or a stopped data dir (telemetryd export -h)
  telemetryd backup -to DIR [-url URL]     back up a stopped data dir, or a running service
                                           through POST /v1/backup (telemetryd backup -h)
  telemetryd restore -from DIR -data-dir D rebuild a data dir from a backup (telemetryd restore -h)
  telemetryd auth add-device|add-token|revoke|list [flags]
                                           edit the -auth-file (telemetryd auth -h)
  telemetryd -version                      print the version

Devices send readings (all end in the JetStream stream of their partition, TELEMETRY_0 to TELEMETRY_7):
  NATS   publish JSON on <prefix>.<device>             (-nats-listen)
  MQTT   3.1.1, QoS 0/1/2, JSON on topic <prefix>/<device> (-mqtt-listen)
  HTTP   InfluxDB line protocol: POST /api/v2/write, POST /write, and
         POST /query for CREATE DATABASE; field temp of measurement
         climate is the value climate_temp

Every flag can also be set by the environment variable named beside it;
a flag on the command line wins. OpenTelemetry export follows the
standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SDK_DISABLED, ...).

Flags:
`

// tuningNote ends `telemetryd -h`.
const tuningNote = `
Tuning settings (stream and table sizes, line protocol mapping, HTTP
limits, timeouts, ...) are set the same way, as flags or TELEMETRY_*
variables; cmd/telemetryd/CONFIGURATION.md lists them under "Tuning",
each with its default and who needs it.
`

// setServiceUsage makes fs, the service's flags, print serviceUsage,
// the fleet's flags (flagdoc) and tuningNote.
func setServiceUsage(fs *flag.FlagSet) {
	fs.Usage = func() {
		fleet, _ := flagdoc.Split(fs)
		w := fs.Output()
		fmt.Fprint(w, serviceUsage)
		cliflag.PrintFlags(w, fleet, envPrefix, "version")
		fmt.Fprint(w, tuningNote)
	}
}

// setUsage makes fs print head, then every flag with its default and
// its TELEMETRY_* variable.
func setUsage(fs *flag.FlagSet, head string) { cliflag.SetUsage(fs, head, envPrefix, "version") }
