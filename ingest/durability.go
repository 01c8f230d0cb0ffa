package ingest

import "time"

// Durability modes: what an acknowledgement (a JetStream publish ack,
// an MQTT QoS 1 PUBACK, the 204 of a line protocol write) promises
// about a power cut. A crash of the process loses nothing acked in any
// mode: the stream's writes are in the kernel, and the ingester acks a
// message only after its readings are committed to the store.
const (
	// DurabilitySynced: the embedded JetStream fsyncs every write
	// before its ack, and the store fsyncs each commit before the
	// ingester acks its messages. An acked reading survives a power
	// cut. Devices' NATS publishes are answered by the service's intake
	// (Config.Intake), which stores them in atomic batches, one fsync
	// each; a line protocol write goes as one message per partition.
	DurabilitySynced = "synced"
	// DurabilityStoreSynced: as DurabilitySynced on the store's side,
	// but the NATS server is external, so whether its publish ack waits
	// for an fsync is its own setting (sync_interval: always).
	DurabilityStoreSynced = "store-synced"
	// DurabilityBuffered: an ack means written to the operating system,
	// not to the disk. The embedded JetStream and the store fsync every
	// sync interval (-sync-interval, 1 s by default); a power cut can
	// lose readings acked before it, in power-cut runs with a 1 s interval
	// up to 1.7 s before
	// (ingest/README.md, "Durability modes").
	DurabilityBuffered = "buffered"
)

// Durability is the mode a service runs in and what its acks promise,
// in a sentence, for /readyz and the start-up log.
type Durability struct {
	Mode string
	Ack  string
}

// DurabilityOf is the mode of a service that fsyncs before acking
// (-sync-writes) or not, on its embedded NATS server or an external
// one.
//
// syncEvery is the sync interval of the buffered mode; intake says
// whether the service answers the devices' publishes (Config.Intake).
func DurabilityOf(syncWrites, embeddedNATS, intake bool, syncEvery time.Duration) Durability {
	switch {
	case syncWrites && embeddedNATS && intake:
		return Durability{Mode: DurabilitySynced,
			Ack: "an acked reading is on disk and survives a power cut: the service stores devices' NATS publishes in atomic batches per partition stream and acks them after the batch's fsync, a line protocol write goes as one message per partition stream, an MQTT QoS 1 publish is fsynced before its PUBACK; the store fsyncs each commit before the stream lets go of it"}
	case syncWrites && embeddedNATS:
		return Durability{Mode: DurabilitySynced,
			Ack: "an acked reading is on disk and survives a power cut: the stream fsyncs each publish before its ack (a line protocol write in atomic batches per partition stream, one fsync each, where it has 32 devices or more in the partition), the store each commit before the stream lets go of it"}
	case syncWrites:
		return Durability{Mode: DurabilityStoreSynced,
			Ack: "the store fsyncs each commit before the stream lets go of it; whether a publish ack waits for the stream's fsync is the external NATS server's sync_interval (always for power-cut safety)"}
	default:
		return Durability{Mode: DurabilityBuffered,
			Ack: "an acked reading survives a crash of the process; a power cut can lose recent acks: readings are written to the operating system, which the stream and the store sync to disk every " +
				syncEvery.String() + " (-sync-interval), and power-cut runs with a 1s interval lost some acked up to 1.7s before the cut (-sync-writes, the default, for power-cut safety)"}
	}
}
