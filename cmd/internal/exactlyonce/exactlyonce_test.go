package exactlyonce

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var base = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

func reading(n int) Reading {
	return Reading{TS: base.Add(time.Duration(n) * time.Second), Values: map[string]any{"n": float64(n)}}
}

func TestCheck(t *testing.T) {
	run := Run{Field: "n", Base: base, Step: time.Second, Published: func(n int) bool { return n < 10 }}
	wrongTime := reading(4)
	wrongTime.TS = wrongTime.TS.Add(time.Millisecond)
	got := []Reading{
		reading(0), reading(1), reading(1), // 1 twice
		reading(3),              // 2 lost
		reading(5),              // published, not acked: allowed
		reading(12),             // never published
		wrongTime,               // 4 at the wrong time: unexpected, and 4 lost
		{TS: base, Values: nil}, // no number
		{TS: base, Values: map[string]any{"n": 1.5}},
		{TS: base.Add(7 * time.Second), Values: map[string]any{"n": int64(7)}}, // a store value
	}
	tally := run.Check([]int{0, 1, 2, 3, 4, 7}, got)
	assert.Equal(t, Tally{Acked: 6, Stored: 10, Lost: 2, Duplicated: 1, Unexpected: 4}, tally)
	assert.False(t, tally.OK())

	tally = run.Check([]int{0, 1}, []Reading{reading(1), reading(0)})
	assert.True(t, tally.OK(), tally.String())
	var sum Tally
	sum.Add(tally)
	sum.Add(Tally{Acked: 1, Lost: 1})
	assert.Equal(t, Tally{Acked: 3, Stored: 2, Lost: 1}, sum)
}

// TestReadDevicePages: every page is read, past any one answer's size,
// and a non-200 answer is an error naming the status.
func TestReadDevicePages(t *testing.T) {
	const total = 25
	var requests int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests++
		assert.Equal(t, "/v1/devices/dev-1/readings", r.URL.Path)
		assert.Equal(t, "Bearer x", r.Header.Get("Authorization"))
		from := 0
		if c := r.URL.Query().Get("cursor"); c != "" {
			from, _ = strconv.Atoi(c)
		}
		var page struct {
			Readings []Reading `json:"readings"`
			Next     string    `json:"next,omitempty"`
		}
		for n := from; n < min(from+10, total); n++ {
			page.Readings = append(page.Readings, reading(n))
		}
		if from+10 < total {
			page.Next = strconv.Itoa(from + 10)
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
	defer srv.Close()
	hdr := http.Header{"Authorization": {"Bearer x"}}
	got, err := ReadDevice(context.Background(), srv.Client(), srv.URL, "dev-1", base, base.Add(time.Hour), hdr)
	require.NoError(t, err)
	assert.Equal(t, 3, requests)
	acked := make([]int, total)
	for i := range acked {
		acked[i] = i
	}
	tally := Run{Field: "n", Base: base, Step: time.Second}.Check(acked, got)
	assert.True(t, tally.OK(), tally.String())
	assert.Equal(t, total, tally.Stored)

	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "no owner", http.StatusServiceUnavailable)
	}))
	defer down.Close()
	_, err = ReadDevice(context.Background(), down.Client(), down.URL, "dev-1", base, base.Add(time.Hour), nil)
	require.ErrorContains(t, err, "503")
}
