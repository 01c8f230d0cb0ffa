// Package twofiles is a path that goes back and forth between two
// files: Start (a.go) calls Middle (b.go), which calls Back (a.go),
// which calls End (b.go).
package twofiles

// Start is the entry.
func Start() int { return Middle() + 1 }

// Back is reached from b.go.
func Back() int { return End() + Start() } // Start: already on the path

type counter struct{ n int }

func (c *counter) add() int { c.n++; return c.n }

// viaInterface is never reached: calls through an interface are not
// followed.
type adder interface{ add() int }

func useAdder(a adder) int { return a.add() }
