// Package fdlimit raises the process's file descriptor limit and
// divides it between the store and the network listeners, so that a
// flood of connections cannot leave the store without descriptors.
package fdlimit

import (
	"log/slog"
	"syscall"
)

const (
	// StoreReserve file descriptors are kept for the store (Badger
	// tables, value logs, the device index) and never handed to
	// network connections.
	StoreReserve = 4096
	// miscReserve covers logs, JetStream files and the like.
	miscReserve = 256
)

// Raise raises the soft file-descriptor limit to the hard limit and
// returns the soft limit now in force (0 when it cannot be read).
func Raise(log *slog.Logger) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the file descriptor limit", "err", err)
		return 0
	}
	if lim.Cur < lim.Max {
		old := lim.Cur
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			log.Warn("cannot raise the file descriptor limit", "soft", old, "hard", lim.Max, "err", err)
			lim.Cur = old
		} else {
			log.Debug("file descriptor limit raised", "from", old, "to", lim.Cur)
		}
	}
	return lim.Cur
}

// Split divides the file descriptors left after the store's reserve
// between HTTP and NATS clients: HTTP keeps at most want (its cap; 0:
// no cap), the embedded NATS server gets the rest. Both are at least
// 16.
func Split(limit uint64, want int) (httpConns, natsConns int) {
	free := int(min(limit, 1<<30)) - StoreReserve - miscReserve
	httpConns = want
	if httpConns == 0 || httpConns > free/2 {
		httpConns = max(16, free/2)
	}
	natsConns = max(16, free-httpConns)
	return httpConns, natsConns
}
