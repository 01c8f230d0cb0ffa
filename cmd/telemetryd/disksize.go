package main

import (
	"strings"

	bytesize "github.com/dustin/go-humanize"

	"github.com/telemetryd/telemetryd/cmd/internal/diskfit"
)

// fitSizes fits the stream sizes and the disk reserve left at their
// defaults to the data dir's file system (package diskfit), logging
// what it chose; sizes set that do not fit refuse the start.
func (m *Main) fitSizes() error {
	room, err := diskfit.Measure(m.cfg.DataDir)
	if err != nil {
		m.log.Warn("cannot measure the data dir's file system; sizes are not checked against it", "err", err)
		return nil
	}
	embedded := m.cfg.NATSURL == ""
	d := DefaultConfig()
	sizes := diskfit.Sizes{StreamMaxBytes: m.cfg.StreamMaxBytes, RejectedMaxBytes: m.cfg.RejectedMaxBytes,
		MQTTStreamMaxBytes: m.cfg.MQTTStreamMaxBytes, DiskReserve: m.cfg.DiskReserve}
	def := diskfit.Sizes{StreamMaxBytes: d.StreamMaxBytes, RejectedMaxBytes: d.RejectedMaxBytes,
		MQTTStreamMaxBytes: d.MQTTStreamMaxBytes, DiskReserve: d.DiskReserve}
	changed, kept, err := diskfit.Fit(&sizes, def, func(flag string) bool { return m.cfg.set[flag] }, room,
		embedded, embedded && m.cfg.MQTTListen != "")
	if err != nil {
		return err
	}
	m.cfg.StreamMaxBytes, m.cfg.RejectedMaxBytes = sizes.StreamMaxBytes, sizes.RejectedMaxBytes
	m.cfg.MQTTStreamMaxBytes, m.cfg.DiskReserve = sizes.MQTTStreamMaxBytes, sizes.DiskReserve
	for _, k := range kept {
		m.log.Warn("small disk: kept as set", "what", k)
	}
	if len(changed) > 0 {
		m.log.Warn("small disk: sizes left at their defaults do not fit the data dir's file system; fitted them (set the flags to choose)",
			"free", bytesize.IBytes(uint64(room.Free)), "data_dir", m.cfg.DataDir, "chosen", strings.Join(changed, ", "))
	}
	return nil
}
