package store

// FaultPoint names a point of Store.Write where a power-cut test stops
// the process (Options.FaultPoint): the crash loop cuts there to show
// that neither boundary between the stream and the store loses an
// acknowledged reading.
type FaultPoint string

const (
	// BeforeCommit: the readings' message is in the stream (fsynced
	// there with sync-always) and the store has not committed them.
	BeforeCommit FaultPoint = "before-commit"
	// AfterCommit: the store committed the readings (and, with
	// SyncWrites, fsynced them) and the ingester has not acknowledged
	// their message to the stream yet.
	AfterCommit FaultPoint = "after-commit"
)

// fault calls Options.FaultPoint, if set.
func (s *Store) fault(p FaultPoint) {
	if f := s.opts.FaultPoint; f != nil {
		f(p)
	}
}
