package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// simulateCuts runs the pacing of a run of msgs messages at base
// interval through cuts whose uptimes and restarts are given, the
// publisher sending each message when it is due. It returns how many
// messages were sent by each cut; with replan false the plan stays the
// one of the rate.
func simulateCuts(msgs int, base time.Duration, ups, restarts []time.Duration, replan bool) []int {
	start := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	p := &pacer{from: start, interval: base}
	sentBy := func(t time.Time) int { // messages due at or before t
		n := 0
		for n < msgs && !p.due(n).After(t) {
			n++
		}
		return n
	}
	var sent []int
	now, prev := start, start
	for i := range ups {
		now = now.Add(ups[i])
		sent = append(sent, sentBy(now))
		now = now.Add(restarts[i])
		if replan {
			next := sentBy(now)
			p.replan(now, next, cutInterval(msgs-next, i+1, len(ups), now.Sub(start), now.Sub(prev), base))
		}
		prev = now
	}
	return sent
}

// Every cut must land while publishes are in flight, so publishing may
// not end before the last cut, however long the restarts take. At a
// fixed rate, a line protocol run (150,000 readings at 400/s, 10 per
// write) whose restarts grew from 15 s to 40 s sent its last write
// before 3 of its 20 cuts.
func TestPacingOutlastsTheCuts(t *testing.T) {
	const msgs, kills = 15000, 20
	base := rateInterval(400, 10)
	uptimes := func() []time.Duration {
		var d []time.Duration
		for i := range kills {
			d = append(d, 2*time.Second+time.Duration(i%4)*time.Second)
		}
		return d
	}
	restarts := map[string]func(i int) time.Duration{
		"growing from 15s to 40s": func(i int) time.Duration { return 15*time.Second + time.Duration(i)*25*time.Second/kills },
		"steady 15s":              func(int) time.Duration { return 15 * time.Second },
		"fast, 1s":                func(int) time.Duration { return time.Second },
		"one slow start at the end": func(i int) time.Duration {
			if i == kills-2 {
				return 30 * time.Second // 1.8 times the cycles before
			}
			return 15 * time.Second
		},
	}
	for name, restart := range restarts {
		t.Run(name, func(t *testing.T) {
			var rs []time.Duration
			for i := range kills {
				rs = append(rs, restart(i))
			}
			sent := simulateCuts(msgs, base, uptimes(), rs, true)
			for i, n := range sent {
				assert.Less(t, n, msgs, "cut %d of %d came after the last message was sent", i+1, kills)
			}
			assert.Greater(t, sent[0], 0, "publishing started before the first cut")
		})
	}
	t.Run("the fixed rate runs out (the profile shows the fault)", func(t *testing.T) {
		var rs []time.Duration
		for i := range kills {
			rs = append(rs, restarts["growing from 15s to 40s"](i))
		}
		sent := simulateCuts(msgs, base, uptimes(), rs, false)
		assert.Equal(t, msgs, sent[kills-1], "at 400/s the last cut comes after the run")
	})
}

// A plan spreads what is left over the cuts to come and one cycle
// more, at least as long as the last cycle, and never goes faster than
// maxSpeedup times the rate.
func TestCutInterval(t *testing.T) {
	base := 25 * time.Millisecond
	for _, c := range []struct {
		left, done, kills int
		elapsed, last     time.Duration
		want              time.Duration
	}{
		{left: 1000, done: 5, kills: 20, elapsed: 100 * time.Second, last: 20 * time.Second, want: 16 * 20 * time.Second / 1000},
		{left: 1000, done: 5, kills: 20, elapsed: 100 * time.Second, last: 40 * time.Second, want: 16 * 40 * time.Second / 1000},
		{left: 1000, done: 20, kills: 20, elapsed: 400 * time.Second, last: 20 * time.Second, want: 20 * time.Second / 1000},
		{left: 100000, done: 5, kills: 20, elapsed: 10 * time.Second, last: 2 * time.Second, want: base / maxSpeedup},
		{left: 0, done: 5, kills: 20, elapsed: 10 * time.Second, last: 2 * time.Second, want: base},
	} {
		t.Run(fmt.Sprintf("%d left after %d of %d", c.left, c.done, c.kills), func(t *testing.T) {
			assert.Equal(t, c.want, cutInterval(c.left, c.done, c.kills, c.elapsed, c.last, base))
		})
	}
}
