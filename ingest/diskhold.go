package ingest

import (
	"fmt"
	"syscall"

	"github.com/dustin/go-humanize"

	"github.com/telemetryd/telemetryd/store/diskuse"
)

// DiskReserve returns a Config.Hold that pauses intake while the file
// system of dir has less than reserve bytes available to the process,
// beyond what Badger's sparse files under dir may still claim (see
// diskuse.Unallocated: a write into one of their holes on a full disk
// ends the process), so it pauses before the store meets a full disk
// (and resumes once space returns). The directory nats (the embedded
// server's streams, written without memory maps) is not counted. A
// reserve of 0 turns it off (nil).
func DiskReserve(dir string, reserve int64) func() error {
	if reserve <= 0 {
		return nil
	}
	return func() error {
		var st syscall.Statfs_t
		if err := syscall.Statfs(dir, &st); err != nil {
			return nil // cannot tell; the store reports real write errors
		}
		free := int64(st.Bavail) * int64(st.Bsize)
		holes := diskuse.Unallocated(dir, "nats")
		if free < reserve+holes {
			return fmt.Errorf("disk full: %s free under %s, below the reserve of %s plus the %s the open day tables' files may still claim",
				humanize.IBytes(uint64(max(free, 0))), dir, humanize.IBytes(uint64(reserve)), humanize.IBytes(uint64(holes)))
		}
		return nil
	}
}

// Holds returns a Config.Hold that reports the first reason any of
// holds gives (nil ones are left out), or nil when none is set.
func Holds(holds ...func() error) func() error {
	var set []func() error
	for _, h := range holds {
		if h != nil {
			set = append(set, h)
		}
	}
	if len(set) == 0 {
		return nil
	}
	return func() error {
		for _, h := range set {
			if err := h(); err != nil {
				return err
			}
		}
		return nil
	}
}
