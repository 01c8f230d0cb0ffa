package store

import "github.com/telemetryd/telemetryd/store/dirlock"

// ErrLocked is returned by Open when another process (or another Store
// in this process) already holds the data directory.
var ErrLocked = dirlock.ErrLocked
