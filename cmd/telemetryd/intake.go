package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/ingest"
	"github.com/telemetryd/telemetryd/ingest/intake"
)

// startIntake starts the intake (ingest.Config.Intake) once every
// partition's stream captures the intake's subjects only: a stream
// still capturing the devices' subjects would answer their publishes
// too, and store each twice.
func (m *Main) startIntake() error {
	icfg := m.ingestConfig()
	if !icfg.Intake {
		return nil
	}
	js, err := jetstream.New(m.nc)
	if err != nil {
		return fmt.Errorf("intake: jetstream: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	log := m.log.With("component", "intake")
	for _, c := range icfg.PerStream() {
		if _, err := ingest.EnsureStream(ctx, js, c, log); err != nil {
			return fmt.Errorf("intake: %w", err)
		}
	}
	nc, err := m.link.Dial("telemetryd-intake")
	if err != nil {
		return fmt.Errorf("intake: %w", err)
	}
	m.intakeNC = nc
	in, err := intake.Start(nc, intake.Config{SubjectPrefix: icfg.SubjectPrefix, Family: icfg.Family(),
		Partitions: icfg.Partitions, Linger: intakeLinger, Logger: log})
	if err != nil {
		return err
	}
	m.intake = in
	log.Debug("the service answers devices' publishes, stored in atomic batches per partition (one fsync per batch)",
		"partitions", icfg.Partitions)
	return nil
}

// stopIntake stops taking publishes and answers what the intake had
// taken, before the ingesters stop.
func (m *Main) stopIntake() {
	if m.intake != nil {
		m.intake.Close()
	}
	if m.intakeNC != nil {
		m.intakeNC.Close()
	}
}

// intakeLinger is how long the intake lets a small batch wait for more
// publishes.
const intakeLinger = time.Millisecond
