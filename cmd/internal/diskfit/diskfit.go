// Package diskfit fits the sizes telemetryd gives its streams and its
// disk reserve to the file system of its data dir.
package diskfit

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
// Sizes the operator set are kept. When the streams set alone do not
// fit (over JetStream's 75%), start-up is refused with an error that
// names the flags and the free space; a reserve set over half the room
// is kept with a warning (ingest then stays paused, as asked).

// MQTTStreams is the number of the embedded MQTT listener's streams.
const MQTTStreams = 5

// Room is what the file system of the data dir offers: Free is what
// is available to the process, JSUsed what the streams already take
// there (JetStream counts it as its own when it starts).
type Room struct {
	Dir          string
	Free, JSUsed int64
}

// Measure measures the file system of dataDir (or of its nearest
// existing parent, when it does not exist yet).
func Measure(dataDir string) (Room, error) {
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
		return Room{}, fmt.Errorf("measure free space under %s: %w", dir, err)
	}
	return Room{Dir: dataDir, Free: int64(st.Bavail) * int64(st.Bsize),
		JSUsed: diskuse.Tree(filepath.Join(dataDir, "nats"))}, nil
}

// Sizes are the sizes Fit fits, in bytes.
type Sizes struct {
	StreamMaxBytes, RejectedMaxBytes, MQTTStreamMaxBytes, DiskReserve int64
}

// Fit fits the sizes of c that the operator left at their defaults
// (def; set names the flags given) to room, and returns what it changed
// (for a warning), what it kept though it does not fit (a reserve larger
// than half the room: ingest stays paused, as the operator asked), or an
// error when the stream sizes set do not fit. embedded says that the
// streams live on this file system (the embedded NATS server), mqtt
// that the embedded MQTT listener's streams do too.
func Fit(c *Sizes, def Sizes, set func(flag string) bool, room Room, embedded, mqtt bool) (changed, kept []string, err error) {
	total := room.Free + room.JSUsed
	explicit := func(flag string, v, d int64) bool { return set(flag) || v != d }
	switch reserveSet := explicit("disk-reserve", c.DiskReserve, def.DiskReserve); {
	case c.DiskReserve > 0 && reserveSet && c.DiskReserve > total/2:
		kept = append(kept, fmt.Sprintf("-disk-reserve %s is more than half of the %s free under %s: ingest pauses almost at once",
			cliflag.FormatBytes(c.DiskReserve), bytesize.IBytes(uint64(room.Free)), room.Dir))
	case c.DiskReserve > 0 && !reserveSet && c.DiskReserve > total/8:
		c.DiskReserve = max(total/16, 1<<20)
		changed = append(changed, "-disk-reserve "+cliflag.FormatBytes(c.DiskReserve))
	}
	if !embedded {
		return changed, kept, nil
	}
	sizes := []size{
		{"-stream-max-bytes", &c.StreamMaxBytes, def.StreamMaxBytes, 1, explicit("stream-max-bytes", c.StreamMaxBytes, def.StreamMaxBytes)},
		{"-rejected-max-bytes", &c.RejectedMaxBytes, def.RejectedMaxBytes, 1, explicit("rejected-max-bytes", c.RejectedMaxBytes, def.RejectedMaxBytes)},
	}
	if mqtt {
		sizes = append(sizes, size{"-mqtt-stream-max-bytes", &c.MQTTStreamMaxBytes, def.MQTTStreamMaxBytes, MQTTStreams,
			explicit("mqtt-stream-max-bytes", c.MQTTStreamMaxBytes, def.MQTTStreamMaxBytes)})
	}
	fitted, err := fitStreams(sizes, room)
	return append(changed, fitted...), kept, err
}

// size is one stream size flag.
type size struct {
	flag     string
	v        *int64
	def      int64
	n        int64 // streams it sizes
	explicit bool
}

// fitStreams fits the sizes left at their defaults into half the room.
func fitStreams(sizes []size, room Room) ([]string, error) {
	total := room.Free + room.JSUsed
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
			bytesize.IBytes(uint64(total)), room.Dir, strings.Join(flagNames(setFlags), " or "))
	}
	share := total/2 - set
	if all <= total/2 || defaulted == 0 {
		return nil, nil
	}
	if share < defaultedStreams<<20 {
		return nil, fmt.Errorf("%s leave too little of the %s free under %s for the other streams; lower them",
			strings.Join(setFlags, ", "), bytesize.IBytes(uint64(total)), room.Dir)
	}
	var changed []string
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
