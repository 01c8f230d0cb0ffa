package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
)

// config is the whole simulator configuration, filled from flags and
// TELEMETRY_SIM_<NAME> environment variables (flags win).
type config struct {
	NATSURL       string
	SubjectPrefix string
	Devices       int
	DevicePrefix  string
	Rate          float64       // readings per second across all devices; 0 = as fast as acks allow
	Duration      time.Duration // 0 = until Count or a signal
	Count         int64         // total readings; 0 = unlimited
	Batch         int           // readings per message
	Format        string        // nested or flat
	TSFormat      string        // rfc3339 or epoch-ms
	Values        int           // values per reading
	MaxPending    int           // async publish window, in messages
	MsgID         bool          // set Nats-Msg-Id (for streams with a duplicate window)
	SeqStart      uint64        // first per-device message sequence number
	Trace         bool          // a span per publish, traceparent in the headers
	Seed          int64         // 0 = pick one from the clock
	Progress      time.Duration // 0 = no progress lines
	LogFormat     string        // text or json
	Protocol      string        // nats, mqtt or line
	MQTTURL       string        // MQTT broker (the service's -mqtt-listen)
	MQTTQoS       int           // 0 or 1
	MQTTClients   int           // MQTT connections sharing the devices
	HTTPURL       string        // base URL of the service for -protocol line
	LineWriters   int           // concurrent line protocol requests
	Token         string        // write token for -protocol line (with an auth file)
}

// maxDevices bounds -devices so the fleet fits in memory comfortably.
const maxDevices = 100_000

// defaultConfig returns the defaults documented in -help.
func defaultConfig() config {
	return config{
		NATSURL:       "nats://127.0.0.1:4222",
		SubjectPrefix: "telemetry",
		Devices:       10,
		DevicePrefix:  "sim-",
		Rate:          10,
		Duration:      time.Minute,
		Batch:         1,
		Format:        "nested",
		TSFormat:      "rfc3339",
		Values:        3,
		MaxPending:    4096,
		MsgID:         true,
		SeqStart:      1,
		Progress:      time.Second,
		LogFormat:     "text",
		Protocol:      "nats",
		MQTTURL:       "tcp://127.0.0.1:1883",
		MQTTQoS:       1,
		MQTTClients:   4,
		HTTPURL:       "http://127.0.0.1:8080",
		LineWriters:   2,
	}
}

// bind registers every field of c on fs with c's values as defaults.
func (c *config) bind(fs *flag.FlagSet) {
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "NATS server URL (comma-separated for a cluster)")
	fs.StringVar(&c.SubjectPrefix, "subject-prefix", c.SubjectPrefix, "publish on <prefix>.<device>")
	fs.IntVar(&c.Devices, "devices", c.Devices, "number of simulated devices")
	fs.StringVar(&c.DevicePrefix, "device-prefix", c.DevicePrefix, "device IDs are <prefix>0001, <prefix>0002, ...")
	fs.Float64Var(&c.Rate, "rate", c.Rate, "readings per second across all devices (0 = as fast as publish acks allow)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "stop after this long (0 = until -count or a signal)")
	fs.Int64Var(&c.Count, "count", c.Count, "stop after this many readings (0 = unlimited)")
	fs.IntVar(&c.Batch, "batch", c.Batch, "readings per message; more than 1 sends a JSON array")
	fs.StringVar(&c.Format, "format", c.Format, `payload shape: nested {"ts":..,"values":{..}} or flat {"ts":..,"temp":..}`)
	fs.StringVar(&c.TSFormat, "ts-format", c.TSFormat, "timestamp form: rfc3339 (UTC, milliseconds; microseconds when a device sends faster) or epoch-ms")
	fs.IntVar(&c.Values, "values", c.Values, "values per reading: temp, humidity, battery, then sensor_4, sensor_5, ...")
	fs.IntVar(&c.MaxPending, "max-pending", c.MaxPending, "most messages published but not yet acked")
	fs.BoolVar(&c.MsgID, "msg-id", c.MsgID, "set Nats-Msg-Id to <device>-<seq>, so a stream with a duplicate window drops retried messages (telemetryd's has none: a retry merges by ts)")
	fs.Uint64Var(&c.SeqStart, "seq-start", c.SeqStart, "first per-device message sequence in Nats-Msg-Id (raise it to re-run inside a stream's duplicate window)")
	fs.BoolVar(&c.Trace, "trace", c.Trace, "start a span per publish and send its W3C traceparent header")
	fs.Int64Var(&c.Seed, "seed", c.Seed, "random seed for the signals (0 = from the clock; the seed used is logged)")
	fs.DurationVar(&c.Progress, "progress", c.Progress, "progress line interval (0 = off)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.StringVar(&c.Protocol, "protocol", c.Protocol, "nats (JetStream publish acks), mqtt (topic <prefix>/<device>) or line (InfluxDB line protocol over HTTP, one request per message)")
	fs.StringVar(&c.MQTTURL, "mqtt-url", c.MQTTURL, "MQTT broker for -protocol mqtt")
	fs.IntVar(&c.MQTTQoS, "mqtt-qos", c.MQTTQoS, "MQTT QoS 0 or 1 (1: a message counts as acked on its PUBACK)")
	fs.IntVar(&c.MQTTClients, "mqtt-clients", c.MQTTClients, "MQTT connections; each device always uses the same one")
	fs.StringVar(&c.HTTPURL, "http-url", c.HTTPURL, "service base URL for -protocol line (POST /api/v2/write)")
	fs.IntVar(&c.LineWriters, "line-writers", c.LineWriters, "concurrent line protocol requests")
	fs.StringVar(&c.Token, "token", c.Token, "write token sent as \"Authorization: Token ...\" with -protocol line")
}

// parse fills c from args, then from the environment for every flag
// not given on the command line, then validates the result.
func (c *config) parse(args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet("telemetry-sim", flag.ContinueOnError)
	fs.SetOutput(out)
	c.bind(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := cliflag.ApplyEnv(fs, envPrefix, getenv); err != nil {
		return err
	}
	return c.validate()
}

// envPrefix starts the environment variable of every flag.
const envPrefix = "TELEMETRY_SIM_"

// validate checks what flag parsing cannot.
func (c *config) validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.NATSURL != "", "-nats-url must not be empty")
	check(c.SubjectPrefix != "" && !strings.ContainsAny(c.SubjectPrefix, ".*> \t\r\n"),
		"-subject-prefix %q must be one NATS subject token (no '.', '*', '>' or spaces), as the service requires", c.SubjectPrefix)
	check(c.Devices >= 1 && c.Devices <= maxDevices, "-devices %d must be 1..%d", c.Devices, maxDevices)
	if c.Devices >= 1 {
		for _, i := range []int{1, c.Devices} {
			if err := deviceID(c.DevicePrefix, i).Validate(); err != nil {
				errs = append(errs, fmt.Errorf("-device-prefix %q: %w", c.DevicePrefix, err))
				break
			}
		}
	}
	check(c.Rate >= 0, "-rate %g must not be negative", c.Rate)
	check(c.Duration >= 0, "-duration %s must not be negative", c.Duration)
	check(c.Count >= 0, "-count %d must not be negative", c.Count)
	check(c.Batch >= 1 && c.Batch <= buckets.MaxBatch, "-batch %d must be 1..%d", c.Batch, buckets.MaxBatch)
	check(c.Format == "nested" || c.Format == "flat", "-format %q must be nested or flat", c.Format)
	check(c.TSFormat == "rfc3339" || c.TSFormat == "epoch-ms", "-ts-format %q must be rfc3339 or epoch-ms", c.TSFormat)
	check(c.Values >= 1 && c.Values <= buckets.MaxValues, "-values %d must be 1..%d", c.Values, buckets.MaxValues)
	check(c.MaxPending >= 1, "-max-pending %d must be at least 1", c.MaxPending)
	check(c.Protocol == "nats" || c.Protocol == "mqtt" || c.Protocol == "line", "-protocol %q must be nats, mqtt or line", c.Protocol)
	check(c.MQTTQoS == 0 || c.MQTTQoS == 1, "-mqtt-qos %d must be 0 or 1", c.MQTTQoS)
	check(c.MQTTClients >= 1, "-mqtt-clients %d must be at least 1", c.MQTTClients)
	check(c.LineWriters >= 1, "-line-writers %d must be at least 1", c.LineWriters)
	check(c.SeqStart >= 1, "-seq-start must be at least 1")
	check(c.Progress >= 0, "-progress %s must not be negative", c.Progress)
	check(c.LogFormat == "text" || c.LogFormat == "json", "-log-format %q must be text or json", c.LogFormat)
	return errors.Join(errs...)
}

// payloadFormat is the payload shape the configuration asks for.
func (c *config) payloadFormat() payloadFormat {
	pf := payloadFormat{shape: shapeNested, ts: tsRFC3339}
	if c.Format == "flat" {
		pf.shape = shapeFlat
	}
	if c.TSFormat == "epoch-ms" {
		pf.ts = tsEpochMillis
	}
	return pf
}

// newLogger builds the simulator's logger.
func newLogger(format string, w io.Writer) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, nil))
	}
	return slog.New(slog.NewTextHandler(w, nil))
}
