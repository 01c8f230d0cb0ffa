package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/options"
	btable "github.com/dgraph-io/badger/v4/table"
	"github.com/dgraph-io/badger/v4/y"
	"github.com/dgraph-io/ristretto/v2/z"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/block"
)

// When the damaged table does not open as a database at all (a table
// file's footer or index is damaged, so Badger refuses the whole
// directory), its table files are read one by one instead: every file
// that still opens gives its blocks, each checked by its own CRC-32C.
// A file is written oldest (lowest number) first and within it a
// device's blocks oldest version first, so where copies disagree the
// newer usually wins; readings merge by device and time either way. A
// memtable log not yet flushed into a table file is not read.

// Badger's entry meta bits (value.go in badger), which it does not
// export.
const (
	badgerBitDelete       = 1 << 0
	badgerBitValuePointer = 1 << 1
)

// salvageFiles writes the sound blocks of every table file in dir that
// opens, counting the files that do not in rep.SkippedFiles.
func (s *Store) salvageFiles(ctx context.Context, dir string, o badger.Options, rep *RepairReport) error {
	ssts, err := filepath.Glob(filepath.Join(dir, "*.sst"))
	if err != nil {
		return err
	}
	slices.SortFunc(ssts, func(a, b string) int {
		ia, _ := btable.ParseFileID(filepath.Base(a))
		ib, _ := btable.ParseFileID(filepath.Base(b))
		return cmpUint(ia, ib)
	})
	for _, path := range ssts {
		blocks, bad, err := readTableFile(path, o)
		rep.BadBlocks += bad
		if err != nil {
			rep.SkippedFiles++
			s.log.Warn("repair: a table file of the damaged table cannot be read; skipping it", "file", path, "err", err)
			continue
		}
		for dev, bs := range blocks {
			if _, deleted := s.DeletedAt(dev); deleted {
				continue
			}
			if err := s.writeBlocks(ctx, bs, rep); err != nil {
				return err
			}
		}
	}
	return nil
}

// readTableFile returns the sound blocks of the table file at path by
// device, and how many blocks failed their checksum. Badger panics on
// some kinds of damage; that is an error for this file.
func readTableFile(path string, o badger.Options) (blocks map[buckets.DeviceID][]foundBlock, bad int, err error) {
	mf, err := z.OpenMmapFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, 0, fmt.Errorf("map: %w", err)
	}
	defer func() {
		if r := recover(); r != nil {
			blocks, err = nil, fmt.Errorf("damaged: %s", firstLine(fmt.Sprint(r)))
		}
		_ = mf.Close(-1)
	}()
	tbl, err := btable.OpenTable(mf, btable.Options{ReadOnly: true, BlockSize: o.BlockSize,
		BloomFalsePositive: o.BloomFalsePositive, ChkMode: options.NoVerification,
		Compression: o.Compression, ZSTDCompressionLevel: o.ZSTDCompressionLevel})
	if err != nil {
		return nil, 0, err
	}
	it := tbl.NewIterator(0)
	defer it.Close()
	blocks = map[buckets.DeviceID][]foundBlock{}
	for it.Rewind(); it.Valid(); it.Next() {
		dev, ref, ok := parseAnyBlockKey(y.ParseKey(it.Key()))
		vs := it.Value()
		if !ok || vs.Meta&(badgerBitDelete|badgerBitValuePointer) != 0 {
			continue
		}
		if err := checkFlag(vs.UserMeta, vs.Value); err != nil {
			bad++
			continue
		}
		_, rs, err := block.Decode(vs.Value, dev)
		if err != nil {
			bad++
			continue
		}
		blocks[dev] = append(blocks[dev], foundBlock{seq: ref.seq, rs: rs})
	}
	return blocks, bad, nil
}
