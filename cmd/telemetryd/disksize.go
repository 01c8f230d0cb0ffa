package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	bytesize "github.com/dustin/go-humanize"

	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
	"github.com/telemetryd/telemetryd/store/diskuse"
)

// Sizes that must fit the data dir's file system. The embedded NATS
// server refuses to create a stream whose -…-max-bytes exceeds 75% of
// the free space of its store dir (data-dir/nats), and the streams and
// the day tables share that file system. At start-up the sizes an
// operator left at their defaults are fitted to it, with a warning
// saying what was chosen:
//
//   - the streams (-stream-max-bytes, -rejected-max-bytes and, with the
//     embedded MQTT listener, 5 × -mqtt-stream-max-bytes) together take
//     at most half of the room (the free space plus what the streams
//     already use), shared in the proportions of their defaults, each at
//     least 1 MiB;
//   - -disk-reserve takes at most an eighth of the room (a sixteenth
//     when it must be fitted).
//
// Sizes the operator set are kept; when they alone do not fit (the
// streams over JetStream's 75%, a reserve over half the room), start-up
// is refused with an error that names the flags and the free space.

// mqttStreams is the number of the embedded MQTT listener's streams.
const mqttStreams = 5

// diskRoom is what the file system of the data dir offers: free is
// what is available to the process, jsUsed what the streams already
// take there (JetStream counts it as its own when it starts).
type diskRoom struct {
	dir          string
	free, jsUsed int64
}

// measureRoom measures the file system of dataDir (or of its nearest
// existing parent, when it does not exist yet).
func measureRoom(dataDir string) (diskRoom, error) {
	dir := dataDir
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return diskRoom{}, fmt.Errorf("measure free space under %s: %w", dir, err)
	}
	return diskRoom{dir: dataDir, free: int64(st.Bavail) * int64(st.Bsize),
		jsUsed: diskuse.Tree(filepath.Join(dataDir, "nats"))}, nil
}

// fitToDisk fits the sizes of c left at their defaults to room, and
// returns what it changed (for the warning), or an error when the sizes
// the operator set do not fit. embedded says that the streams live on
// this file system (the embedded NATS server), mqtt that the embedded
// MQTT listener's streams do too.
func fitToDisk(c *Config, room diskRoom, embedded, mqtt bool) ([]string, error) {
	d := DefaultConfig()
	total := room.free + room.jsUsed
	var changed []string
	explicit := func(flag string, v, def int64) bool { return c.set[flag] || v != def }
	explicitReserve := explicit("disk-reserve", c.DiskReserve, d.DiskReserve)
	switch {
	case c.DiskReserve > 0 && explicitReserve && c.DiskReserve > total/2:
		return nil, fmt.Errorf("-disk-reserve %s is more than half of the %s free under %s: ingest would pause almost at once; lower it (0 turns it off)",
			cliflag.FormatBytes(c.DiskReserve), bytesize.IBytes(uint64(room.free)), room.dir)
	case c.DiskReserve > 0 && !explicitReserve && c.DiskReserve > total/8:
		c.DiskReserve = max(total/16, 1<<20)
		changed = append(changed, "-disk-reserve "+cliflag.FormatBytes(c.DiskReserve))
	}
	if !embedded {
		return changed, nil
	}
	type size struct {
		flag     string
		v        *int64
		def      int64
		n        int64 // streams it sizes
		explicit bool
	}
	sizes := []size{
		{"-stream-max-bytes", &c.StreamMaxBytes, d.StreamMaxBytes, 1, explicit("stream-max-bytes", c.StreamMaxBytes, d.StreamMaxBytes)},
		{"-rejected-max-bytes", &c.RejectedMaxBytes, d.RejectedMaxBytes, 1, explicit("rejected-max-bytes", c.RejectedMaxBytes, d.RejectedMaxBytes)},
	}
	if mqtt {
		sizes = append(sizes, size{"-mqtt-stream-max-bytes", &c.MQTTStreamMaxBytes, d.MQTTStreamMaxBytes, mqttStreams,
			explicit("mqtt-stream-max-bytes", c.MQTTStreamMaxBytes, d.MQTTStreamMaxBytes)})
	}
	var set, defaulted, defaultedStreams, all int64
	var setFlags []string
	for _, s := range sizes {
		all += *s.v * s.n
		if s.explicit {
			set += *s.v * s.n
			setFlags = append(setFlags, fmt.Sprintf("%s %s", s.flag, cliflag.FormatBytes(*s.v)))
		} else {
			defaulted += *s.v * s.n
			defaultedStreams += s.n
		}
	}
	jsLimit := total / 4 * 3 // the server's own limit
	if set > jsLimit {
		return nil, fmt.Errorf("%s: the streams need %s, more than the %s the NATS server allows them (75%% of the %s free under %s); lower %s",
			strings.Join(setFlags, ", "), bytesize.IBytes(uint64(set)), bytesize.IBytes(uint64(jsLimit)),
			bytesize.IBytes(uint64(total)), room.dir, strings.Join(flagNames(setFlags), " or "))
	}
	share := total/2 - set
	if all <= total/2 || defaulted == 0 {
		return changed, nil
	}
	if share < defaultedStreams<<20 {
		return nil, fmt.Errorf("%s leave too little of the %s free under %s for the other streams; lower them",
			strings.Join(setFlags, ", "), bytesize.IBytes(uint64(total)), room.dir)
	}
	for _, s := range sizes {
		if s.explicit {
			continue
		}
		// Its s.n streams get share*s.def*s.n/defaulted together.
		*s.v = max((share*s.def/defaulted)&^(1<<20-1), 1<<20)
		changed = append(changed, s.flag+" "+cliflag.FormatBytes(*s.v))
	}
	return changed, nil
}

// flagNames keeps the flag of each "flag value".
func flagNames(flags []string) []string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i], _, _ = strings.Cut(f, " ")
	}
	return out
}

// fitSizes measures the data dir's file system and fits the sizes of
// the configuration to it (fitToDisk), logging what it chose.
func (m *Main) fitSizes() error {
	room, err := measureRoom(m.cfg.DataDir)
	if err != nil {
		m.log.Warn("cannot measure the data dir's file system; sizes are not checked against it", "err", err)
		return nil
	}
	embedded := m.cfg.NATSURL == ""
	changed, err := fitToDisk(&m.cfg, room, embedded, embedded && m.cfg.MQTTListen != "")
	if err != nil {
		return err
	}
	if len(changed) > 0 {
		m.log.Warn("small disk: sizes left at their defaults do not fit the data dir's file system; fitted them (set the flags to choose)",
			"free", bytesize.IBytes(uint64(room.free)), "data_dir", m.cfg.DataDir, "chosen", strings.Join(changed, ", "))
	}
	return nil
}
