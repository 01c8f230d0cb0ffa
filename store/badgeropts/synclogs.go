package badgeropts

import (
	"errors"
	"io/fs"
	"path/filepath"
)

// Badger's Sync fsyncs the write-ahead log of the memtable being filled
// and the newest value log only. When a memtable fills, Badger starts a
// new log and flushes the full one to a table file in the background,
// without fsyncing what was written to the old log since the last
// Sync; a stream position the store wrote meanwhile would vouch for
// readings that only the page cache holds. Likewise a value log that
// was full. SyncLogs closes that gap: it fsyncs every write-ahead log
// (*.mem) and value log (*.vlog) in a database's directory, and the
// directory, whose new files Badger does not sync into it.

// SyncLogs fsyncs, with fsync, the logs of the Badger database in dir
// and dir itself. A log removed meanwhile (flushed) is skipped.
func SyncLogs(dir string, fsync func(path string) error) error {
	var errs []error
	for _, pattern := range []string{"*.mem", "*.vlog"} {
		files, err := filepath.Glob(filepath.Join(dir, pattern))
		errs = append(errs, err)
		for _, f := range files {
			if err := fsync(f); !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
	}
	errs = append(errs, fsync(dir))
	return errors.Join(errs...)
}
