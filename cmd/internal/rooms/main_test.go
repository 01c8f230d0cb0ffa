package main

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The walk of testdata/twofiles goes a.go, b.go, a.go, b.go, a.go (the
// concrete method is in a.go): three returns over two rooms. Start,
// called again from Back, is walked once; functions no call on the
// path reaches (unused, useAdder) are not on it.
func TestTwoFilesPath(t *testing.T) {
	const pkg = "github.com/telemetryd/telemetryd/cmd/internal/rooms/testdata/twofiles"
	g, err := load([]string{pkg})
	require.NoError(t, err)
	w := walk{g: g, seen: map[string]bool{}}
	w.visit(pkg + ".Start")
	assert.Equal(t, []string{pkg + ".Start", pkg + ".Middle", pkg + ".Back", pkg + ".End", "(*" + pkg + ".counter).add"}, w.order)
	var out bytes.Buffer
	report(&out, w, false)
	assert.Contains(t, out.String(), "functions 5, rooms 2, entries 5, returns 3\n")
	assert.Contains(t, out.String(), "  3  testdata/twofiles/a.go\n")
}
