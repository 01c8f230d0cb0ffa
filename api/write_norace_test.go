//go:build !race

package api

// raceEnabled: the race detector drops some of what is put in a
// sync.Pool, so reuse cannot be counted on.
const raceEnabled = false
