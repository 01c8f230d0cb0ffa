package repair

import (
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/atomicfile"
)

// replayFileName lists the days repaired while the service was stopped
// whose stream readings the service replays at its next start.
const replayFileName = "REPLAY"

// Replays is the list of repaired days whose stream readings are to be
// replayed, kept in a file of the data directory Dir.
type Replays struct {
	Dir string
}

// Mark records that the stream's readings of day are to be replayed.
func (r Replays) Mark(day buckets.Day) error {
	days := r.Pending()
	if !slices.Contains(days, day) {
		days = append(days, day)
	}
	return r.save(days)
}

// Pending lists the days Mark recorded.
func (r Replays) Pending() []buckets.Day {
	b, err := os.ReadFile(filepath.Join(r.Dir, replayFileName))
	if err != nil {
		return nil
	}
	var days []buckets.Day
	for _, f := range strings.Fields(string(b)) {
		if d, err := buckets.ParseDay(f); err == nil {
			days = append(days, d)
		}
	}
	return days
}

// Clear forgets day's pending replay.
func (r Replays) Clear(day buckets.Day) error {
	return r.save(slices.DeleteFunc(r.Pending(), func(d buckets.Day) bool { return d == day }))
}

func (r Replays) save(days []buckets.Day) error {
	if len(days) == 0 {
		err := os.Remove(filepath.Join(r.Dir, replayFileName))
		if os.IsNotExist(err) {
			return nil
		}
		return err
	}
	var b strings.Builder
	for _, d := range days {
		b.WriteString(d.String() + "\n")
	}
	return atomicfile.Replace(r.Dir, replayFileName, []byte(b.String()))
}
