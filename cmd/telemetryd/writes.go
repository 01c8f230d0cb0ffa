package main

import (
	"fmt"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/lineproto"
)

// withWrites configures the line protocol write endpoints.
func (m *Main) withWrites(acfg *api.Config) error {
	nc, err := m.link.Dial("telemetryd-writes")
	if err != nil {
		return fmt.Errorf("api writes: %w", err)
	}
	m.writesNC = nc
	icfg := m.ingestConfig()
	icfg.Logger = m.log.With("component", "api")
	if k := m.cfg.Cluster; k.Partitions > 0 {
		// The cluster's one stream partitions by each message's device
		// token: a write goes device by device, never as one message of
		// several devices, which the token of its subject would place in
		// one partition.
		icfg.Partitions = k.Partitions
		// Streams per partition take a write as one message per
		// partition, on the partition's own subjects.
		icfg.PartitionStreams = k.PartitionStreams
	}
	pub, err := ingest.NewPublisher(nc, icfg)
	if err != nil {
		return fmt.Errorf("api writes: %w", err)
	}
	tags, err := m.cfg.lineDeviceTags()
	if err != nil {
		return err
	}
	mode, err := m.cfg.lineTags()
	if err != nil {
		return err
	}
	sep, err := m.cfg.lineNameSeparator()
	if err != nil {
		return err
	}
	acfg.Writes = &api.WriteConfig{
		Publisher:     pub,
		Mapper:        lineproto.Mapper{},
		DeviceTags:    tags,
		Tags:          mode,
		NameSeparator: sep,
		MaxBytes:      m.cfg.MaxWriteBytes,
		Window:        m.window(),
		Budget:        m.budget.Writes,
	}
	// Leave room for headers within the server's max payload (unknown,
	// so the 1 MiB default, until the first connect).
	if mp := int(m.nc.MaxPayload()); mp >= 64<<10 {
		acfg.Writes.MaxMessageBytes = mp - 4096
	}
	return nil
}
