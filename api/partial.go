package api

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// A line protocol write is published part by part (or chunk by chunk),
// in body order, and every part's messages are acked by the stream
// before the next part starts. So when a write is cut short — its
// publish timeout passed before a part could start, or publishing a
// part failed (the stream full, the server away) — the lines of the
// parts before are accepted and will be stored, and the answer says
// so, Influx style: 503 with Retry-After and
//
//	{"code": "unavailable", "message": "partial write: lines 1 to P of T were accepted (R readings) ...",
//	 "acceptedLines": P, "acceptedReadings": R}
//
// P counts physical lines of the body from its top (blank and comment
// lines included), so a client may retry from line P+1, or retry the
// whole body: a line stored twice is stored once. When a part failed
// while it was being published, some of its lines may have been
// accepted as well; the message names that range. Nothing is ever
// answered "failed" for lines that were accepted: a cut before any
// line was accepted says "no line was accepted".

// partialState is what a write has accepted so far.
type partialState struct {
	startBy       time.Time // no part starts after this
	acceptedLines int       // physical lines accepted from the top
	acceptedRead  int       // their readings
	failedTo      int       // last physical line of a part that failed midway; 0 if none
	cause         error
}

// errCutShort marks a write cut short (partialAnswer answers it).
var errCutShort = errors.New("write cut short")

// mayStart reports errCutShort when the part starting after line offset
// may not start: the publish timeout passed or the client went away.
func (p *partialState) mayStart(ctx context.Context, offset int) error {
	switch {
	case ctx.Err() != nil:
		p.cause = ctx.Err()
	case time.Now().After(p.startBy):
		p.cause = errors.New("the write took longer than its publish timeout")
	default:
		return nil
	}
	p.acceptedLines = offset
	return errCutShort
}

// accepted records that part was published whole, with readings.
func (p *partialState) accepted(part bodyChunk, readings int) {
	p.acceptedLines = part.offset + lineCount(part.lines)
	p.acceptedRead += readings
}

// failed records that publishing part failed with err.
func (p *partialState) failed(part bodyChunk, err error) error {
	p.acceptedLines = part.offset
	p.failedTo = part.offset + lineCount(part.lines)
	p.cause = err
	return errCutShort
}

// lineCount is the number of physical lines in b (a last line without
// a newline counts).
func lineCount(b []byte) int {
	n := bytes.Count(b, []byte{'\n'})
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	return n
}

// partialAnswer is the answer of a write that err cut short (err from
// mayStart or failed), or err itself for any other error.
func partialAnswer(err error, body []byte, sum *writeSummary, timeout time.Duration) error {
	if !errors.Is(err, errCutShort) {
		return err
	}
	p := &sum.partialState
	total := lineCount(body)
	p.failedTo = min(p.failedTo, total)
	cause := p.cause.Error()
	if errors.Is(p.cause, context.DeadlineExceeded) {
		cause = fmt.Sprintf("publishing took longer than %s", timeout+partGrace)
	}
	var msg string
	switch {
	case p.acceptedLines == 0 && p.failedTo == 0:
		msg = fmt.Sprintf("no line was accepted (%s); retry the request", cause)
	case p.acceptedLines == 0:
		msg = fmt.Sprintf("partial write: lines 1 to %d of %d may be partly accepted, lines %d to %d were not (%s); retry the request (a line stored twice is stored once)",
			p.failedTo, total, p.failedTo+1, total, cause)
	case p.failedTo > 0:
		msg = fmt.Sprintf("partial write: lines 1 to %d of %d were accepted (%d readings) and will be stored; lines %d to %d may be partly accepted, lines %d to %d were not (%s); retry from line %d, or the whole request (a line stored twice is stored once)",
			p.acceptedLines, total, p.acceptedRead, p.acceptedLines+1, p.failedTo, p.failedTo+1, total, cause, p.acceptedLines+1)
	default:
		msg = fmt.Sprintf("partial write: lines 1 to %d of %d were accepted (%d readings) and will be stored; lines %d to %d were not (%s); retry them, or the whole request (a line stored twice is stored once)",
			p.acceptedLines, total, p.acceptedRead, p.acceptedLines+1, total, cause)
	}
	ie := influxErr(http.StatusServiceUnavailable, "unavailable", "%s", msg)
	lines, readings := p.acceptedLines, p.acceptedRead
	ie.AcceptedLines, ie.AcceptedReadings = &lines, &readings
	return ie
}
