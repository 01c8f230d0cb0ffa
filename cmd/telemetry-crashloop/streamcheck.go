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
	"github.com/telemetryd/telemetryd/ingest/topology"
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
	// AtAckedSeq counts the lost messages in no stream by what their
	// stream holds now at the sequence their ack named (seqFate).
	AtAckedSeq map[seqFate]int
	// Examples are the first few of them, with what is there.
	Examples []string
	// Positions are the stream positions the store had saved at the
	// end (its positions file), and PastPosition counts the lost
	// messages still in a stream at or below their stream's position:
	// the store vouched for them and does not have them.
	Positions    map[string]uint64
	PastPosition int
	PositionsErr error
	// DeadLetters counts the dead letters in the streams by error code,
	// and DeadLettered those of them that carry a lost message (the
	// ingester gave up on it: its readings were never stored).
	DeadLetters  map[string]int
	DeadLettered map[string]int
	Err          error // the streams could not be read
}

// seqFate is what a stream holds at the sequence a lost message's ack
// named.
type seqFate string

const (
	// fateReused: another message has the sequence. The stream lost
	// the acked message (and what followed it) at a cut, and the
	// messages published after the restart took its sequences, so the
	// stream's last sequence was back above the acked one by the time
	// the loop compared them.
	fateReused seqFate = "another message has its sequence (the stream lost it and gave its sequence again)"
	// fateGone: the sequence is within the stream and holds nothing.
	fateGone seqFate = "its sequence holds nothing (a gap in the stream)"
	// fatePastEnd: the stream ends before the sequence.
	fatePastEnd seqFate = "the stream ends before its sequence"
	// fateNoStream: the stream named by the ack is gone.
	fateNoStream seqFate = "the stream its ack named is gone"
	// fateUnknown: no ack position was recorded (MQTT, line protocol,
	// a duplicate ack), or the stream could not be asked.
	fateUnknown seqFate = "unknown (no ack position recorded, or the stream could not be asked)"
)

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
	if len(l.AtAckedSeq) > 0 {
		fmt.Fprint(&b, "\n  in no stream, at the sequence its ack named:")
		for _, f := range slices.Sorted(maps.Keys(l.AtAckedSeq)) {
			fmt.Fprintf(&b, "\n    %s: %d", f, l.AtAckedSeq[f])
		}
		for _, e := range l.Examples {
			fmt.Fprintf(&b, "\n    e.g. %s", e)
		}
	}
	if len(l.DeadLetters) > 0 {
		fmt.Fprint(&b, "\n  dead letters by code (with a lost message):")
		for _, c := range slices.Sorted(maps.Keys(l.DeadLetters)) {
			fmt.Fprintf(&b, " %s %d (%d)", c, l.DeadLetters[c], l.DeadLettered[c])
		}
	}
	if l.InStream > 0 {
		if l.PositionsErr != nil {
			fmt.Fprintf(&b, "\n  the store's positions not read: %v", l.PositionsErr)
		} else {
			fmt.Fprintf(&b, "\n  still in a stream and at or below the position the store saved for it (the store vouched for them): %d; positions:", l.PastPosition)
			for _, s := range slices.Sorted(maps.Keys(l.Positions)) {
				fmt.Fprintf(&b, " %s=%d", s, l.Positions[s])
			}
		}
	}
	return b.String()
}

// lostInStreams looks for the messages of res's lost readings (NATS
// messages of one device each) in every stream of the service.
//
// positions reads the store's saved stream positions (nil: not read).
func lostInStreams(ctx context.Context, js jetstream.JetStream, pub *publisher, res *Result, positions func() (map[string]uint64, error)) *LostInStreams {
	out := &LostInStreams{ByCut: map[int][2]int{}, ByStream: map[string]int{}, AtAckedSeq: map[seqFate]int{},
		DeadLetters: map[string]int{}, DeadLettered: map[string]int{}}
	cutOf := map[int]int{} // message -> cut
	for i, seq := range res.LostSeqs {
		cutOf[seq/pub.cfg.Batch] = res.LostCuts[i]
	}
	out.Messages = len(cutOf)
	found := map[int]string{}
	foundSeq := map[int]uint64{}
	// dead letters by device token and stream sequence of their original
	dead := map[string]string{}
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
		if err := scanStream(ctx, js, st, func(m jetstream.Msg, seq uint64) {
			if code := m.Headers().Get(topology.HeaderErrorCode); code != "" && topology.IsRejected(m.Subject()) {
				out.DeadLetters[code]++
				dead[m.Subject()[strings.LastIndexByte(m.Subject(), '.')+1:]+"/"+m.Headers().Get(topology.HeaderStreamSeq)] = code
				return
			}
			id := m.Headers().Get(jetstream.MsgIDHeader)
			n, err := strconv.Atoi(strings.TrimPrefix(id, "crash-"))
			if err != nil || !strings.HasPrefix(id, "crash-") {
				return
			}
			if _, lost := cutOf[n]; lost {
				if _, dup := found[n]; !dup {
					found[n] = st
					foundSeq[n] = seq
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
	for _, m := range slices.Sorted(maps.Keys(cutOf)) {
		if _, ok := found[m]; ok {
			continue
		}
		fate, example := atAckedSeq(ctx, js, pub, m)
		out.AtAckedSeq[fate]++
		if example != "" && len(out.Examples) < 5 {
			out.Examples = append(out.Examples, example)
		}
	}
	for m := range found {
		if code, ok := dead[pub.device(m)+"/"+strconv.FormatUint(foundSeq[m], 10)]; ok {
			out.DeadLettered[code]++
		}
	}
	if out.InStream > 0 && positions != nil {
		out.Positions, out.PositionsErr = positions()
		for m, st := range found {
			if pos, ok := out.Positions[st]; ok && foundSeq[m] <= pos {
				out.PastPosition++
			}
		}
	}
	return out
}

// atAckedSeq says what the stream holds now at the sequence message
// m's ack named, with an example line for the report.
func atAckedSeq(ctx context.Context, js jetstream.JetStream, pub *publisher, m int) (seqFate, string) {
	at, ok := pub.ackedSeqs.msgAt(m)
	if !ok {
		return fateUnknown, ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, at.stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fateNoStream, fmt.Sprintf("%s: %s seq %d", msgID(m), at.stream, at.seq)
	}
	if err != nil {
		return fateUnknown, ""
	}
	info, err := s.Info(ctx)
	if err != nil {
		return fateUnknown, ""
	}
	if at.seq > info.State.LastSeq {
		return fatePastEnd, fmt.Sprintf("%s: %s seq %d, the stream ends at %d", msgID(m), at.stream, at.seq, info.State.LastSeq)
	}
	raw, err := s.GetMsg(ctx, at.seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return fateGone, fmt.Sprintf("%s: %s seq %d, none there (the stream holds %d-%d)", msgID(m), at.stream, at.seq, info.State.FirstSeq, info.State.LastSeq)
	}
	if err != nil {
		return fateUnknown, ""
	}
	return fateReused, fmt.Sprintf("%s: %s seq %d holds %q", msgID(m), at.stream, at.seq, raw.Header.Get(jetstream.MsgIDHeader))
}

// scanStream calls seen with every message of stream st (headers
// only) and its sequence.
func scanStream(ctx context.Context, js jetstream.JetStream, st string, seen func(m jetstream.Msg, seq uint64)) error {
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
			if md, err := m.Metadata(); err == nil {
				seq = md.Sequence.Stream
				seen(m, seq)
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

// streamSeqs keeps the highest sequence acked per stream, and where
// each message's (first, not duplicate) ack said it was stored.
type streamSeqs struct {
	mu  sync.Mutex
	max map[string]uint64
	at  map[int]ackedAt
}

// ackedAt is the stream and sequence a message's ack named.
type ackedAt struct {
	stream string
	seq    uint64
}

func (s *streamSeqs) noteMsg(m int, stream string, seq uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at == nil {
		s.at = map[int]ackedAt{}
	}
	if _, ok := s.at[m]; !ok {
		s.at[m] = ackedAt{stream, seq}
	}
}

// msgAt returns where message m's ack said it was stored.
func (s *streamSeqs) msgAt(m int) (ackedAt, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	a, ok := s.at[m]
	return a, ok
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

// ConsumerRegress is a consumer whose ack floor, read after the restart
// that followed a cut, is below the one read after the start before:
// the consumer's progress was lost (its state file lost or read wrong)
// and the stream is delivered again from there, every message of it
// counting a delivery once more.
type ConsumerRegress struct {
	Cut      int
	Stream   string
	Before   uint64 // the ack floor read after the start before the cut
	After    uint64 // the ack floor read after the restart
	Redelivs int    // messages the consumer redelivered (NumRedelivered) after the restart
}

func (c ConsumerRegress) String() string {
	return fmt.Sprintf("cut %d: %s's consumer ack floor %d after the start before, %d after the restart (%d messages redelivered)",
		c.Cut, c.Stream, c.Before, c.After, c.Redelivs)
}

// consumerFloors reads the ack floor and redelivery count of every
// consumer of the streams named in acked.
func consumerFloors(ctx context.Context, js jetstream.JetStream, streams []string) (map[string][2]uint64, error) {
	out := map[string][2]uint64{}
	for _, name := range streams {
		ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
		s, err := js.Stream(ictx, name)
		if err != nil {
			cancel()
			return out, fmt.Errorf("stream %s: %w", name, err)
		}
		lister := s.ListConsumers(ictx)
		for info := range lister.Info() {
			out[name+"/"+info.Name] = [2]uint64{info.AckFloor.Stream, uint64(info.NumRedelivered)}
		}
		err = lister.Err()
		cancel()
		if err != nil {
			return out, fmt.Errorf("consumers of %s: %w", name, err)
		}
	}
	return out, nil
}

// regressed compares the consumers' ack floors after the restart that
// followed cut n with those after the start before.
func regressed(n int, before, after map[string][2]uint64) []ConsumerRegress {
	var out []ConsumerRegress
	for _, k := range slices.Sorted(maps.Keys(after)) {
		if b, ok := before[k]; ok && after[k][0] < b[0] {
			out = append(out, ConsumerRegress{Cut: n, Stream: k, Before: b[0], After: after[k][0], Redelivs: int(after[k][1])})
		}
	}
	return out
}
