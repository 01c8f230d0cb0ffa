package ingest

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/buckets/wire"
	"github.com/telemetryd/telemetryd/ingest/lpwire"
	"github.com/telemetryd/telemetryd/ingest/topology"
)

// publishTimeout bounds one dead-letter publish or message lookup.
const publishTimeout = 5 * time.Second

// deadLetterSubject is rejected.<prefix>.<device> for the original
// subject, or rejected.<prefix>._invalid when its device token cannot
// be used as a subject token.
func (in *Ingester) deadLetterSubject(subject string) string {
	tok := in.deviceToken(subject)
	if !validToken(tok) {
		tok = topology.InvalidDeviceToken
	}
	return in.cfg.Subjects().Rejected(tok)
}

// deadLetter republishes the message to its dead letter subject and then
// terminates it. When the publish fails the message is nak'ed instead,
// so nothing is lost; its next delivery tries again.
func (in *Ingester) deadLetter(ctx context.Context, it item, ve *buckets.ValidationError) {
	subject := it.msg.Subject()
	dup, err := in.publishDeadLetter(ctx, subject, it.seq, it.msg.Headers(), it.msg.Data(), ve)
	if err != nil {
		in.log.Error("dead letter not published; the message is retried",
			"subject", subject, "code", ve.Code, "stream_seq", it.seq, "err", err)
		in.nak(ctx, it)
		return
	}
	if err := it.msg.Term(); err != nil {
		// A redelivery is dead-lettered again and deduplicated by the
		// rejected stream.
		in.log.Warn("terminate after dead letter failed", "subject", subject, "stream_seq", it.seq, "err", err)
	}
	if !dup {
		in.rejected(ctx, subject, it.seq, it.msg.Headers(), it.msg.Data(), ve)
	}
}

// rejected logs and counts one dead letter.
func (in *Ingester) rejected(ctx context.Context, subject string, seq uint64, hdr nats.Header, data []byte,
	ve *buckets.ValidationError) {
	args := []any{"subject", subject, "code", ve.Code, "stream_seq", seq, "err", ve.Error()}
	if ve.Code == buckets.CodeMaxDeliveries || ve.Code == buckets.CodeInternalFailure {
		// Valid data the service failed to store: an operator must look.
		in.log.Error("message sent to the dead letter subject", args...)
	} else if ok, held := in.rejectLog.Allow(time.Now()); ok {
		// A device sent something invalid; the metrics and the rejected
		// stream carry the detail, the log a sample (logsample.go).
		if held > 0 {
			args = append(args, "rejected_unlogged_before", held)
		}
		in.log.Info("message rejected", args...)
	}
	in.m.messages.Add(ctx, 1, in.m.rejected)
	in.m.readings.Add(ctx, countReadings(hdr, data), rejectedReadings(ve.Code))
}

// publishDeadLetter publishes the original payload and headers (but the
// server's Nats-* headers) with the error headers, through JetStream so
// it is stored. The message ID (stream, its creation time, sequence)
// makes the rejected stream drop a second dead letter for the same
// message within its duplicate window (a retried terminate, or a
// redelivery dead-lettered again); dup reports that case.
func (in *Ingester) publishDeadLetter(ctx context.Context, subject string, seq uint64, hdr nats.Header,
	data []byte, ve *buckets.ValidationError) (dup bool, err error) {
	m := nats.NewMsg(in.deadLetterSubject(subject))
	m.Data = data
	for k, vs := range hdr {
		if !strings.HasPrefix(k, "Nats-") {
			m.Header[k] = append([]string(nil), vs...)
		}
	}
	m.Header.Set(topology.HeaderErrorCode, string(ve.Code))
	m.Header.Set(topology.HeaderError, headerValue(ve.Error()))
	opts := []jetstream.PublishOpt{jetstream.WithExpectStream(in.cfg.RejectedStream)}
	if seq > 0 {
		m.Header.Set(topology.HeaderStreamSeq, strconv.FormatUint(seq, 10))
		in.mu.Lock()
		id := in.dedupPrefix + strconv.FormatUint(seq, 10)
		in.mu.Unlock()
		opts = append(opts, jetstream.WithMsgID(id))
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	ack, err := in.js.PublishMsg(ctx, m, opts...)
	if err != nil {
		return false, fmt.Errorf("publish dead letter to %s: %w", m.Subject, err)
	}
	return ack.Duplicate, nil
}

// countReadings is how many readings a rejected payload held: the count
// of a binary payload (package wire or lpwire) or of a non-empty JSON array,
// otherwise 1.
func countReadings(hdr nats.Header, data []byte) int64 {
	if hdr.Get(lpwire.Header) == lpwire.Format {
		return int64(max(lpwire.Count(data), 1))
	}
	if hdr.Get(wire.Header) == wire.Format {
		return int64(wire.Count(data))
	}
	var batch []json.RawMessage
	if json.Unmarshal(data, &batch) == nil && len(batch) > 0 {
		return int64(len(batch))
	}
	return 1
}
