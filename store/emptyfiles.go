package store

import (
	"strings"

	"github.com/dgraph-io/badger/v4"
)

// badgerNewFile ends the error badger.Open returns for a memtable or
// value log file it found empty: the text of ristretto's z.NewFile,
// which Badger formats into its error (errors.Is cannot see it).
const badgerNewFile = "Create a new file"

// maxEmptyFileReopens bounds the reopens of openSizingEmptyFiles: each
// one gets past one empty file.
const maxEmptyFileReopens = 8

// openSizingEmptyFiles opens a Badger database with open, and opens it
// again while open fails on a write-ahead log (*.mem) or value log
// (*.vlog) file it found empty. Badger creates those files and sizes
// them with ftruncate, but nothing makes the size durable before the
// first synced write into the file; a power cut before that leaves the
// file empty, and badger.Open then fails after sizing it
// (dgraph-io/badger#2207). The sized file holds zeros, that is no
// entries, so the next open goes past it: nothing that was synced is
// skipped.
func openSizingEmptyFiles(opts badger.Options, open func(badger.Options) (*badger.DB, error)) (*badger.DB, error) {
	db, err := open(opts)
	for i := 0; err != nil && strings.HasSuffix(err.Error(), badgerNewFile) && i < maxEmptyFileReopens; i++ {
		if opts.Logger != nil {
			opts.Logger.Warningf("reopening %s: %v", opts.Dir, err)
		}
		db, err = open(opts)
	}
	return db, err
}
