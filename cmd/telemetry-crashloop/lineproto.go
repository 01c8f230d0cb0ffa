package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// lineMeasurement is the measurement of the line protocol readings: the
// reading number arrives as the value lineMeasurement.seq.
const lineMeasurement = "crash"

// lineConns is how many connections the line protocol writes share,
// below the service's connections per client (64 by default).
const lineConns = 32

// lineSender publishes the crash loop's messages as InfluxDB line
// protocol writes (POST /api/v2/write); a message counts as acked once
// its write was answered 204. A write that fails (the service is down,
// a 503) is sent again; its readings carry their timestamps, so a
// second copy merges into the same readings.
type lineSender struct {
	pub    *publisher
	url    string
	header http.Header
	client *http.Client
}

func newLineSender(p *publisher, httpAddr string, header http.Header) *lineSender {
	return &lineSender{pub: p, header: header,
		url: "http://" + httpAddr + "/api/v2/write?bucket=crashloop&precision=ms",
		client: &http.Client{Timeout: 30 * time.Second,
			Transport: &http.Transport{MaxConnsPerHost: lineConns, MaxIdleConnsPerHost: lineConns}}}
}

// body is message m as line protocol: one line per reading,
// `crash,device=<device> seq=<seq>i <ms>`, each on its message's device
// or, with Config.Spread, on its own.
func (s *lineSender) body(m int) []byte {
	p := s.pub
	first, last := m*p.cfg.Batch, min((m+1)*p.cfg.Batch, p.cfg.Readings)
	var buf []byte
	for seq := first; seq < last; seq++ {
		buf = append(buf, lineMeasurement+",device="...)
		buf = append(buf, deviceName(p.deviceOf(seq))...)
		buf = append(buf, " seq="...)
		buf = strconv.AppendInt(buf, int64(seq), 10)
		buf = append(buf, "i "...)
		buf = strconv.AppendInt(buf, p.base.UnixMilli()+int64(seq), 10)
		buf = append(buf, '\n')
	}
	return buf
}

// send writes message m; the channel reports whether it was answered
// 204.
func (s *lineSender) send(m int) (<-chan error, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, s.url, bytes.NewReader(s.body(m)))
	if err != nil {
		return nil, err
	}
	for k, vs := range s.header {
		req.Header[k] = vs
	}
	req.Header.Set("Content-Type", "text/plain; charset=utf-8")
	done := make(chan error, 1)
	go func() {
		resp, err := s.client.Do(req)
		if err != nil {
			done <- err
			return
		}
		defer resp.Body.Close()
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		if resp.StatusCode != http.StatusNoContent {
			done <- fmt.Errorf("write: %s: %s", resp.Status, msg)
			return
		}
		done <- nil
	}()
	return done, nil
}
