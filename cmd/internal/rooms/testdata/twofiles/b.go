package twofiles

// Middle is reached from a.go.
func Middle() int { return Back() }

// End is the last room, and calls a method of a concrete type.
func End() int { c := &counter{}; return c.add() }

// unused is not on the path.
func unused() int { return useAdder(&counter{}) }
