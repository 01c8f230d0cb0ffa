// Package ui holds the built-in dashboard page served at /ui/: a device
// list with last seen, attributes and latest values, filtered by device
// ID prefix and by attribute (Prometheus matchers sent as match=, a bare
// fleet=East read as {fleet="East"}, the server's message shown when it
// refuses one), devices silent for longer than a threshold marked (10
// minutes unless changed, a preference kept in localStorage), and a
// device view with its attributes and a chart per numeric value over
// 1h/24h/7d/30d drawn from the aggregates endpoint, refreshing itself,
// and its text values listed. Sparse data reads as data: when it
// covers a small part of the window the time axis is fitted to it (in
// finer buckets, with a line saying so), points a line cannot show are
// markers, booleans and states are step lines, empty buckets within a
// device's usual spacing are joined, each legend shows the last value,
// a window without data says so, and a silent device says for how long
// and against which threshold (README.md has the details). With an
// auth file the page shows a sign-in form that takes a read token,
// keeps it in the tab's sessionStorage and sends it as
// "Authorization: Bearer"; the files themselves hold no data and load
// without a token. The files are embedded in the binary and served as
// they are; the chart library is uPlot (MIT, vendored from npm with its
// licence in uPlot.LICENSE). The screenshots under screenshots/ are
// written by cmd/telemetryd's Chromium tests.
package ui

import (
	"embed"
	"io/fs"
)

//go:embed static
var static embed.FS

// Files returns the page's files; index.html is the page itself. Every
// file sits at the top level.
func Files() fs.FS {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	return sub
}
