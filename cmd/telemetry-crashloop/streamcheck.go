package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/cmd/internal/lazyfs"
)

// After a power-cut run that lost readings, the loop looks for the
// messages that carried them in the service's streams (by their
// Nats-Msg-Id, which the intake keeps). A message still in a stream
// was durable there and the store lost or skipped it (a replay gap); a
// message in no stream was lost by the stream as well (the service
// acked it before it was on disk, or the file system lost what was
// fsynced). The streams keep every message of a run this small: they
// let go of settled messages only near their size limit.

// LostInStreams is where the messages of the lost readings were at the
// end of the run.
type LostInStreams struct {
	Messages int // messages with a lost reading
	InStream int // of them, still in a stream
	// ByCut counts, per cut (as Result.LostCuts), the lost messages in
	// a stream [0] and in none [1].
	ByCut map[int][2]int
	// ByStream counts the lost messages each stream still holds.
	ByStream map[string]int
	// Devices counts the devices of the lost messages in no stream.
	Devices int
	Err     error // the streams could not be read
}

func (l *LostInStreams) String() string {
	if l.Err != nil {
		return "streams not read: " + l.Err.Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "lost readings' messages: %d; still in a stream (the store lost or skipped them): %d; in no stream (the stream lost them too): %d, of %d devices",
		l.Messages, l.InStream, l.Messages-l.InStream, l.Devices)
	for _, c := range slices.Sorted(maps.Keys(l.ByCut)) {
		fmt.Fprintf(&b, "\n  cut %d: in a stream %d, in none %d", c, l.ByCut[c][0], l.ByCut[c][1])
	}
	for _, s := range slices.Sorted(maps.Keys(l.ByStream)) {
		fmt.Fprintf(&b, "\n  %s holds %d", s, l.ByStream[s])
	}
	return b.String()
}

// lostInStreams looks for the messages of res's lost readings (NATS
// messages of one device each) in every stream of the service.
func lostInStreams(ctx context.Context, js jetstream.JetStream, pub *publisher, res *Result) *LostInStreams {
	out := &LostInStreams{ByCut: map[int][2]int{}, ByStream: map[string]int{}}
	cutOf := map[int]int{} // message -> cut
	for i, seq := range res.LostSeqs {
		cutOf[seq/pub.cfg.Batch] = res.LostCuts[i]
	}
	out.Messages = len(cutOf)
	found := map[int]string{}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	names := js.StreamNames(ctx)
	var streams []string
	for n := range names.Name() {
		if !strings.HasPrefix(n, "KV_") && !strings.HasPrefix(n, "OBJ_") {
			streams = append(streams, n)
		}
	}
	if err := names.Err(); err != nil {
		out.Err = err
		return out
	}
	for _, st := range streams {
		if err := scanStream(ctx, js, st, func(id string) {
			m, err := strconv.Atoi(strings.TrimPrefix(id, "crash-"))
			if err != nil || !strings.HasPrefix(id, "crash-") {
				return
			}
			if _, lost := cutOf[m]; lost {
				if _, dup := found[m]; !dup {
					found[m] = st
					out.ByStream[st]++
				}
			}
		}); err != nil {
			out.Err = fmt.Errorf("stream %s: %w", st, err)
			return out
		}
	}
	devices := map[string]bool{}
	for m, c := range cutOf {
		n := out.ByCut[c]
		if _, ok := found[m]; ok {
			n[0]++
			out.InStream++
		} else {
			n[1]++
			devices[pub.device(m)] = true
		}
		out.ByCut[c] = n
	}
	out.Devices = len(devices)
	return out
}

// scanStream calls seen with the Nats-Msg-Id of every message of
// stream st, reading headers only.
func scanStream(ctx context.Context, js jetstream.JetStream, st string, seen func(id string)) error {
	s, err := js.Stream(ctx, st)
	if err != nil {
		return err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	last := info.State.LastSeq
	if info.State.Msgs == 0 {
		return nil
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{HeadersOnly: true})
	if err != nil {
		return err
	}
	for {
		batch, err := c.Fetch(1000, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return err
		}
		n := 0
		var seq uint64
		for m := range batch.Messages() {
			n++
			if id := m.Headers().Get(jetstream.MsgIDHeader); id != "" {
				seen(id)
			}
			if md, err := m.Metadata(); err == nil {
				seq = md.Sequence.Stream
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		if n == 0 || seq >= last {
			return nil
		}
	}
}

// LazyFSHealth is what LazyFS wrote and the kernel logged about it
// during a power-cut run.
type LazyFSHealth struct {
	Mounts       int            // LazyFS processes started
	OutputFaults int            // lines of its output a healthy run does not write
	FirstFaults  []string       // the first of them
	KernelFaults []string       // dmesg lines about a lazyfs process while one of the run's ran
	Exits        map[string]int // how its processes ended, counted by exit status
}

// lazyFSHealth reads lfs's output and the kernel's log.
func lazyFSHealth(lfs *lazyfs.FS) *LazyFSHealth {
	h := &LazyFSHealth{Mounts: len(lfs.Pids())}
	h.FirstFaults, h.OutputFaults = lfs.OutputFaults(5)
	h.KernelFaults = lfs.KernelFaults()
	h.Exits = map[string]int{}
	for _, e := range lfs.Exits() {
		h.Exits[cmp.Or(e, "running")]++
	}
	return h
}

// String reports the health and the cache usage before each cut.
func (h *LazyFSHealth) String(cuts []cut) string {
	var b strings.Builder
	fmt.Fprintf(&b, "lazyfs: %d mounts, %d unexpected lines in its output, %d kernel faults while it ran; exits:", h.Mounts, h.OutputFaults, len(h.KernelFaults))
	for _, e := range slices.Sorted(maps.Keys(h.Exits)) {
		fmt.Fprintf(&b, " %s x%d,", e, h.Exits[e])
	}
	fmt.Fprint(&b, " (an unmount ends it with SIGABRT); cache usage before each cut (%):")
	for _, c := range cuts {
		fmt.Fprintf(&b, " %.0f", c.CacheUsage)
	}
	for _, l := range h.FirstFaults {
		fmt.Fprintf(&b, "\n  output: %s", l)
	}
	for _, l := range h.KernelFaults {
		fmt.Fprintf(&b, "\n  kernel: %s", l)
	}
	return b.String()
}

// streamSeqs keeps the highest sequence acked per stream.
type streamSeqs struct {
	mu  sync.Mutex
	max map[string]uint64
}

func (s *streamSeqs) note(stream string, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.max == nil {
		s.max = map[string]uint64{}
	}
	s.max[stream] = max(s.max[stream], seq)
}

func (s *streamSeqs) snapshot() map[string]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.max)
}

// StreamShortfall is a stream that, after a cut, ended below a
// sequence it had acked before it: it lost acked messages.
type StreamShortfall struct {
	Cut    int
	Stream string
	Acked  uint64 // the highest sequence acked before the cut
	Last   uint64 // the stream's last sequence after the restart
}

func (s StreamShortfall) String() string {
	return fmt.Sprintf("cut %d: %s acked up to seq %d, holds up to %d after the restart (%d acked messages gone)",
		s.Cut, s.Stream, s.Acked, s.Last, s.Acked-s.Last)
}

// checkStreams compares, after the restart that followed cut n, each
// stream's last sequence with the highest one acked before the cut
// (acked): a stream that ends below it lost messages it had acked,
// whatever the store did.
func checkStreams(ctx context.Context, js jetstream.JetStream, n int, acked map[string]uint64) ([]StreamShortfall, error) {
	var out []StreamShortfall
	for _, name := range slices.Sorted(maps.Keys(acked)) {
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		s, err := js.Stream(ictx, name)
		var info *jetstream.StreamInfo
		if err == nil {
			info, err = s.Info(ictx)
		}
		cancel()
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			out = append(out, StreamShortfall{Cut: n, Stream: name, Acked: acked[name]})
			continue
		}
		if err != nil {
			return out, fmt.Errorf("stream %s: %w", name, err)
		}
		if last := info.State.LastSeq; last < acked[name] {
			out = append(out, StreamShortfall{Cut: n, Stream: name, Acked: acked[name], Last: last})
		}
	}
	return out, nil
}
