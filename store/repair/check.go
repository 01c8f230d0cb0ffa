// Package repair deals with damaged day tables: it checks a table's
// files before Badger opens them (Badger panics on a damaged footer or
// index in goroutines of its own, which would take the process down),
// and it salvages what can still be read of a damaged table, and the
// day's copy in a backup, by writing their sound blocks back into the
// store, and it keeps the list of repaired days whose stream readings
// are to be replayed (Replays). The store moves the damaged table aside
// and blocks the day around it; this package reads and writes only
// through the small interfaces it declares.
package repair

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	btable "github.com/dgraph-io/badger/v4/table"

	"github.com/dgraph-io/ristretto/v2/z"
	"github.com/telemetryd/telemetryd/store/blocked"
)

// CheckFiles opens every SSTable file in dir the way Badger will,
// but in the calling goroutine and with panics recovered. Badger opens
// table files in goroutines of its own and panics on a damaged footer
// or index, which would take the whole process down; checking first
// turns that into an error for one day table.
//
// It reads each file's footer, index and last block only, so its cost
// is a few small reads per file, not a scan of the data.
func CheckFiles(dir string, o badger.Options) error {
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return err
	}
	listed := manifestTables(dir, o)
	for _, path := range ssts {
		if id, ok := btable.ParseFileID(filepath.Base(path)); ok && listed != nil {
			if _, in := listed[id]; !in {
				// Not in the MANIFEST: a table file a crash interrupted
				// while it was written; Badger removes it on open.
				continue
			}
		}
		if err := checkTableFile(path, o); err != nil {
			return fmt.Errorf("table file %s: %w", filepath.Base(path), err)
		}
	}
	return nil
}

// manifestTables returns the ids of the table files the MANIFEST of
// the database in dir lists, or nil when it cannot be read (then every
// file is checked).
func manifestTables(dir string, o badger.Options) map[uint64]badger.TableManifest {
	f, err := os.Open(filepath.Join(dir, badger.ManifestFilename))
	if err != nil {
		return nil
	}
	defer f.Close()
	m, err := replayManifest(f, o)
	if err != nil {
		return nil
	}
	return m.Tables
}

// replayManifest is badger.ReplayManifestFile with panics turned into
// errors.
func replayManifest(f *os.File, o badger.Options) (m badger.Manifest, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("manifest: %v", r)
		}
	}()
	m, _, err = badger.ReplayManifestFile(f, o.ExternalMagicVersion, o)
	return m, err
}

func checkTableFile(path string, o badger.Options) (err error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("map: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("damaged: %s", blocked.FirstLine(fmt.Sprint(r)))
		}
		_ = mf.Close(-1)
	}()
	_, err = btable.OpenTable(mf, btable.Options{
		ReadOnly:             true,
		BlockSize:            o.BlockSize,
		BloomFalsePositive:   o.BloomFalsePositive,
		ChkMode:              options.NoVerification,
		Compression:          o.Compression,
		ZSTDCompressionLevel: o.ZSTDCompressionLevel,
	})
	return err
}
