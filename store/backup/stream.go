package backup

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
	"github.com/dgraph-io/ristretto/v2/z"
	"google.golang.org/protobuf/proto"
)

// deleteMeta is the meta bit of a Badger deletion marker in its
// backup format (bitDelete in Badger).
const deleteMeta = 1

// streamNewest writes, in Badger's backup format (what DB.Load reads),
// the newest version of every key that was written after since and is
// not deleted; the deletions are listKeys' work. Badger's own
// Stream.Backup writes every version above since, which for a day
// table is mostly the blocks the compactor merged away meanwhile, and
// a deletion only while Badger still keeps its marker: one that
// compaction dropped with the block it deleted left that block in the
// restore. It returns the highest version written.
func streamNewest(ctx context.Context, st *badger.Stream, since uint64, w io.Writer) (uint64, error) {
	st.SinceTs = since
	st.KeyToList = func(key []byte, itr *badger.Iterator) (*pb.KVList, error) {
		return newestKV(itr.Item(), since)
	}
	var maxVersion uint64
	st.Send = func(buf *z.Buffer) error {
		list, err := badger.BufferToKVList(buf)
		if err != nil {
			return err
		}
		out := list.Kv[:0]
		for _, kv := range list.Kv {
			if kv.StreamDone {
				continue
			}
			maxVersion = max(maxVersion, kv.Version)
			out = append(out, kv)
		}
		if len(out) == 0 {
			return nil
		}
		list.Kv = out
		return writeKVList(w, list)
	}
	if err := st.Orchestrate(ctx); err != nil {
		return 0, err
	}
	return maxVersion, nil
}

// writeKVList writes list in Badger's backup format: its length, 8
// bytes little-endian, then the list.
func writeKVList(w io.Writer, list *pb.KVList) error {
	b, err := proto.Marshal(list)
	if err != nil {
		return err
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// newestKV is the entry streamNewest writes for item, the newest
// version of its key: none when it is not above since, or deleted.
func newestKV(item *badger.Item, since uint64) (*pb.KVList, error) {
	if item.Version() <= since {
		return &pb.KVList{}, nil
	}
	kv := &pb.KV{Key: item.KeyCopy(nil), Version: item.Version(), UserMeta: []byte{item.UserMeta()}, ExpiresAt: item.ExpiresAt()}
	if item.IsDeletedOrExpired() {
		return &pb.KVList{}, nil
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return nil, err
	}
	kv.Value = v
	return &pb.KVList{Kv: []*pb.KV{kv}}, nil
}

// dirInode is the inode number of dir, 0 if unknown.
func dirInode(dir string) uint64 {
	info, err := os.Stat(dir)
	if err != nil {
		return 0
	}
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return st.Ino
	}
	return 0
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// ReadManifest reads the newest manifest of the backup directory dir.
func ReadManifest(dir string) (Manifest, error) {
	data, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return Manifest{}, err
	}
	var m Manifest
	if err := json.Unmarshal(data, &m); err != nil {
		return Manifest{}, fmt.Errorf("%s: %w", filepath.Join(dir, manifestName), err)
	}
	if m.Format < formatTables || m.Format > Format {
		return Manifest{}, fmt.Errorf("%s: backup format %d, this build reads %d to %d", filepath.Join(dir, manifestName), m.Format, formatTables, Format)
	}
	return m, nil
}
