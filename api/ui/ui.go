// Package ui holds the built-in dashboard page served at /ui/ (DESIGN
// §10): a device list with last seen and latest values, and a device
// view with a chart per numeric value over 1h/24h/7d/30d drawn from the
// aggregates endpoint, refreshing itself. The files are embedded in the
// binary and served as they are; the chart library is uPlot (MIT,
// vendored from npm with its licence in uPlot.LICENSE).
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
