package store

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	btable "github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/ristretto/v2/z"
)

// checkTableFiles opens every SSTable file in dir the way Badger will,
// but in the calling goroutine and with panics recovered. Badger opens
// table files in goroutines of its own and panics on a damaged footer
// or index, which would take the whole process down; checking first
// turns that into an error for one day table.
//
// It reads each file's footer, index and last block only, so its cost
// is a few small reads per file, not a scan of the data.
func checkTableFiles(dir string, o badger.Options) error {
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return err
	}
	for _, path := range ssts {
		if err := checkTableFile(path, o); err != nil {
			return fmt.Errorf("table file %s: %w", filepath.Base(path), err)
		}
	}
	return nil
}

func checkTableFile(path string, o badger.Options) (err error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("map: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("damaged: %s", firstLine(fmt.Sprint(r)))
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

// firstLine trims a panic message to its first non-empty line.
func firstLine(s string) string {
	for _, line := range strings.Split(s, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "==") {
			return line
		}
	}
	return s
}
