package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/api"
	"github.com/telemetryd/telemetryd/buckets/linemsg"
	"github.com/telemetryd/telemetryd/buckets/wire"
)

// slowPublisher acknowledges each call after delay, or fails the call
// number failAt (1-based; 0: never), and counts what it acknowledged.
type slowPublisher struct {
	delay  time.Duration
	failAt int

	mu       sync.Mutex
	calls    int
	readings int
}

func (p *slowPublisher) Publish(ctx context.Context, msgs []linemsg.Message) error {
	p.mu.Lock()
	p.calls++
	call := p.calls
	p.mu.Unlock()
	if call == p.failAt {
		return errors.New("stream full")
	}
	select {
	case <-time.After(p.delay):
	case <-ctx.Done():
		return ctx.Err()
	}
	n := 0
	for _, m := range msgs {
		if !m.DeadLetter {
			n += wire.Count(m.Data)
		}
	}
	p.mu.Lock()
	p.readings += n
	p.mu.Unlock()
	return nil
}

// bigBody is just under 16 MiB of lines over 50,000 devices, one
// reading a line, and its line count.
func bigBody(at time.Time) ([]byte, int) {
	var b []byte
	n := 0
	for {
		line := fmt.Appendf(nil, "m,device=d%d v=%d %d\n", n%50_000, n, at.Add(time.Duration(n)*time.Microsecond).UnixNano())
		if len(b)+len(line) > api.DefaultMaxWriteBytes {
			return b, n
		}
		b = append(b, line...)
		n++
	}
}

type partialBody struct {
	Code             string `json:"code"`
	Message          string `json:"message"`
	AcceptedLines    *int   `json:"acceptedLines"`
	AcceptedReadings *int   `json:"acceptedReadings"`
}

// A 16 MiB write cut short answers what was accepted: when its publish
// timeout passes between parts, the lines of the parts published (and
// exactly those) are named; when a part fails, the lines before it are
// named and the part's range is said to be uncertain. Every line is
// one reading here, so the accepted lines are the readings the
// publisher acknowledged.
func TestWriteCutShortNamesWhatWasAccepted(t *testing.T) {
	now := time.Date(2026, 11, 22, 12, 0, 0, 0, time.UTC)
	body, lines := bigBody(now.Add(-time.Hour))
	require.Greater(t, lines, 350_000)

	decode := func(t *testing.T, resp string) partialBody {
		t.Helper()
		var pb partialBody
		require.NoError(t, json.Unmarshal([]byte(resp), &pb), resp)
		require.NotNil(t, pb.AcceptedLines, resp)
		require.NotNil(t, pb.AcceptedReadings, resp)
		return pb
	}
	t.Run("publish timeout between parts", func(t *testing.T) {
		// The first part must start within the timeout (its lines are
		// parsed first: seconds are room on a loaded machine); each part
		// outlasts it, so the next one does not.
		pub := &slowPublisher{delay: 2500 * time.Millisecond}
		url := newWriteServer(t, api.WriteConfig{Publisher: pub, PublishTimeout: 2 * time.Second}, now)
		code, resp := postLines(t, url, body)
		require.Equal(t, http.StatusServiceUnavailable, code, resp)
		pb := decode(t, resp)
		assert.Positive(t, *pb.AcceptedLines)
		assert.Less(t, *pb.AcceptedLines, lines)
		assert.Equal(t, pub.readings, *pb.AcceptedReadings, "the readings named are the readings published")
		assert.Equal(t, pub.readings, *pb.AcceptedLines, "one reading a line")
		assert.Contains(t, pb.Message, fmt.Sprintf("partial write: lines 1 to %d of %d were accepted (%d readings) and will be stored; lines %d to %d were not",
			*pb.AcceptedLines, lines, pub.readings, *pb.AcceptedLines+1, lines))
	})
	t.Run("a part fails", func(t *testing.T) {
		pub := &slowPublisher{failAt: 3}
		url := newWriteServer(t, api.WriteConfig{Publisher: pub}, now)
		code, resp := postLines(t, url, body)
		require.Equal(t, http.StatusServiceUnavailable, code, resp)
		pb := decode(t, resp)
		assert.Equal(t, pub.readings, *pb.AcceptedReadings)
		assert.Equal(t, pub.readings, *pb.AcceptedLines)
		assert.Contains(t, pb.Message, "may be partly accepted")
		assert.Contains(t, pb.Message, "stream full")
	})
	t.Run("nothing accepted", func(t *testing.T) {
		pub := &slowPublisher{failAt: 1}
		url := newWriteServer(t, api.WriteConfig{Publisher: pub}, now)
		code, resp := postLines(t, url, body)
		require.Equal(t, http.StatusServiceUnavailable, code, resp)
		pb := decode(t, resp)
		assert.Zero(t, *pb.AcceptedLines)
		assert.Zero(t, pub.readings)
		assert.NotContains(t, pb.Message, "were accepted")
	})
}
