package main

import (
	"path/filepath"

	"github.com/telemetryd/telemetryd/cmd/internal/security"
	"github.com/telemetryd/telemetryd/ingest/natsembed"
)

// validateSecurity checks the security flags against the listeners they
// guard (package security).
func (c *Config) validateSecurity() error {
	return c.Security.Validate(c.NATSURL, c.listeners())
}

// listeners are the addresses the service would listen on.
func (c *Config) listeners() []security.Listener {
	ls := []security.Listener{{Flag: "-http-addr", Addr: c.HTTPAddr}, {Flag: "-pprof-addr", Addr: c.PprofAddr}}
	if c.NATSURL == "" {
		ls = append(ls, security.Listener{Flag: "-nats-listen", Addr: c.NATSListen}, security.Listener{Flag: "-mqtt-listen", Addr: c.MQTTListen})
	}
	return ls
}

// embeddedNATS is the embedded server's configuration: listeners,
// storage and memory, with the access rules' share added.
func (m *Main) embeddedNATS() natsembed.Config {
	return m.sec.EmbeddedNATS(natsembed.Config{
		Listen:             m.cfg.NATSListen,
		MQTTListen:         m.cfg.MQTTListen,
		StoreDir:           filepath.Join(m.cfg.DataDir, "nats"),
		SyncAlways:         m.cfg.SyncWrites,
		SyncInterval:       m.cfg.SyncInterval,
		JetStreamMaxMemory: m.budget.JetStream,
		SubjectPrefix:      m.cfg.SubjectPrefix,
		Partitions:         m.cfg.streamPartitions(),
		MQTTStreamMaxBytes: m.cfg.MQTTStreamMaxBytes,
		Logger:             m.log,
		MeterProvider:      m.tel.Meter,
	})
}
