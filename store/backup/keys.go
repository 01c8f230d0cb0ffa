package backup

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
)

// An incremental copy of a table must delete from the restore every key
// the table no longer holds: above all the open blocks the compactor
// merged since the previous backup. Badger's deletion markers cannot
// tell: compaction drops a marker together with the value it deletes
// once no reader needs them, and the copy then never sees the deletion.
// So every copy of a table also writes the keys the table holds at the
// copied version (a key list, DAY.keys beside DAY.kv), and the next
// incremental copy deletes the keys of the previous list that are gone,
// at its own version. Only those: a block written and merged between
// two backups was never in one, and its deletion is not copied.
//
// A key list is gzip-compressed; each key is its length (uvarint) and
// its bytes, in Badger's key order. A restore does not read it.

// maxKeyLen bounds a key read back from a key list (Badger's own
// limit is 65,000 bytes).
const maxKeyLen = 1 << 16

// deletionsPerList is how many deletions go into one list of the copy.
const deletionsPerList = 1024

// listKeys writes the keys txn sees (a snapshot at version at) into
// the key list name of this backup and, when prev (the previous
// backup's list) is set, the deletion at version at of every key of
// prev that txn does not see into w, the database's copy; each, if
// set, is called with every item. prev must have been verified.
func (b *backupRun) listKeys(ctx context.Context, txn *badger.Txn, at uint64, prev *File, name string, w io.Writer, each func(*badger.Item) error) (*File, error) {
	var old *keyReader
	if prev != nil {
		var err error
		if old, err = openKeyList(filepath.Join(b.dir, filepath.FromSlash(prev.Path))); err != nil {
			return nil, fmt.Errorf("key list of the previous backup: %w", err)
		}
		defer old.close()
	}
	rel := filepath.Join(b.sub, name)
	out, err := os.OpenFile(filepath.Join(b.dir, rel), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	cw := &countWriter{w: io.MultiWriter(out, h)}
	kw := newKeyWriter(cw)
	err = diffKeys(ctx, txn, old, kw, &deletions{w: w, version: at}, each)
	if err == nil {
		err = kw.close()
	}
	if err == nil {
		err = out.Sync()
	}
	if err = errors.Join(err, out.Close()); err != nil {
		return nil, fmt.Errorf("key list: %w", err)
	}
	return &File{Path: filepath.ToSlash(rel), Version: at, Size: cw.n, SHA256: hex.EncodeToString(h.Sum(nil))}, nil
}

// diffKeys writes every key txn sees to kw, calls each (if set) with
// its item and, when old is set, deletes each key old lists that txn
// does not see.
func diffKeys(ctx context.Context, txn *badger.Txn, old *keyReader, kw *keyWriter, del *deletions, each func(*badger.Item) error) error {
	next := func() ([]byte, error) { return nil, io.EOF }
	if old != nil {
		next = old.next
	}
	p, err := next()
	it := txn.NewIterator(badger.IteratorOptions{})
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		k := it.Item().Key()
		if err := kw.add(k); err != nil {
			return err
		}
		if each != nil {
			if err := each(it.Item()); err != nil {
				return err
			}
		}
		for ; err == nil && bytes.Compare(p, k) < 0; p, err = next() {
			if err := del.add(p); err != nil {
				return err
			}
		}
		if err == nil && bytes.Equal(p, k) {
			p, err = next()
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	for ; err == nil; p, err = next() {
		if err := del.add(p); err != nil {
			return err
		}
	}
	if !errors.Is(err, io.EOF) {
		return err
	}
	return del.flush()
}

// deletions writes deletion markers in Badger's backup format.
type deletions struct {
	w       io.Writer
	version uint64
	list    pb.KVList
}

func (d *deletions) add(key []byte) error {
	d.list.Kv = append(d.list.Kv, &pb.KV{Key: bytes.Clone(key), Version: d.version, Meta: []byte{deleteMeta}})
	if len(d.list.Kv) < deletionsPerList {
		return nil
	}
	return d.flush()
}

func (d *deletions) flush() error {
	if len(d.list.Kv) == 0 {
		return nil
	}
	err := writeKVList(d.w, &d.list)
	d.list.Kv = d.list.Kv[:0]
	return err
}

// keyWriter writes a key list.
type keyWriter struct {
	zw  *gzip.Writer
	bw  *bufio.Writer
	buf []byte
}

func newKeyWriter(w io.Writer) *keyWriter {
	zw, _ := gzip.NewWriterLevel(w, gzip.BestSpeed) // a valid level
	return &keyWriter{zw: zw, bw: bufio.NewWriter(zw)}
}

func (kw *keyWriter) add(key []byte) error {
	kw.buf = binary.AppendUvarint(kw.buf[:0], uint64(len(key)))
	if _, err := kw.bw.Write(kw.buf); err != nil {
		return err
	}
	_, err := kw.bw.Write(key)
	return err
}

func (kw *keyWriter) close() error {
	if err := kw.bw.Flush(); err != nil {
		return err
	}
	return kw.zw.Close()
}

// keyReader reads a key list.
type keyReader struct {
	f   *os.File
	zr  *gzip.Reader
	br  *bufio.Reader
	key []byte
}

func openKeyList(path string) (*keyReader, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(bufio.NewReader(f))
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &keyReader{f: f, zr: zr, br: bufio.NewReader(zr)}, nil
}

// next returns the next key, valid until the next call, or io.EOF at
// the end of the list.
func (r *keyReader) next() ([]byte, error) {
	n, err := binary.ReadUvarint(r.br)
	if err != nil {
		return nil, err // io.EOF only at a key boundary
	}
	if n > maxKeyLen {
		return nil, fmt.Errorf("%s: a key of %d bytes", r.f.Name(), n)
	}
	if uint64(cap(r.key)) < n {
		r.key = make([]byte, n)
	}
	r.key = r.key[:n]
	if _, err := io.ReadFull(r.br, r.key); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("%s: %w", r.f.Name(), err)
	}
	return r.key, nil
}

func (r *keyReader) close() { _ = r.f.Close() }
