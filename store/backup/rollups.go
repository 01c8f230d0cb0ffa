package backup

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
)

// The rollup period databases are backed up after the day tables, each
// like a table: at one snapshot (its last completed commit), in full
// the first time and then incrementally against the previous backup,
// with a key list (rollups/LEVEL/YYYY-MM.keys beside .kv). A period
// database is not in managed mode, so its versions are its own commit
// timestamps, which only grow, also across restarts and restores. The
// incremental copy holds the newest version of every record rewritten
// since (a window a late reading merged again), and the deletion of
// every key of the previous key list that is gone (a deleted device).
// A period dropped by retention is not in the manifest, so a restore
// does not bring it back; one made again later (another directory) is
// copied in full.
//
// Copied after the tables: before a table is dropped its last windows
// are put in the rollups, so a day dropped while the backup runs is
// either in the copied tables or in the copied rollups.

// rollups copies every rollup period database; done counts the
// databases copied before them.
func (b *backupRun) rollups(ctx context.Context, names []string, view func(string, func(string, *badger.DB) error) (bool, error), done, total int) error {
	prev := map[string]Table{}
	for _, t := range b.prev.Rollups {
		prev[t.Rollup] = t
	}
	for i, name := range names {
		if err := ctx.Err(); err != nil {
			return err
		}
		// A period dropped meanwhile is not viewed, and not listed.
		_, err := view(name, func(dir string, db *badger.DB) error {
			return b.rollup(ctx, name, dir, db, prev[name], done+i+1, total)
		})
		if err != nil {
			return fmt.Errorf("backup rollup %s: %w", name, err)
		}
	}
	return nil
}

// rollup copies the period database name in dir at its last completed
// commit: in full, or the records written above prev's version and the
// deletions since prev's key list when prev is the same database.
func (b *backupRun) rollup(ctx context.Context, name, dir string, db *badger.DB, prev Table, done, total int) error {
	txn := db.NewTransaction(false)
	defer txn.Discard()
	at := txn.ReadTs()
	ino := dirInode(dir)
	since, prev := b.chain("rollup "+name, prev, ino, at)
	entry := Table{Rollup: name, Version: at, Inode: ino, Files: slices.Clone(prev.Files), Keys: prev.Keys}
	var f File
	if since == 0 || at > since {
		base := filepath.Join(rollupsDir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Join(b.dir, b.sub, filepath.Dir(base)), 0o755); err != nil {
			return err
		}
		var err error
		f, err = b.copyDB(ctx, base+".kv", since, func(w io.Writer) (uint64, error) {
			sets := &newest{w: w, since: since}
			keys, err := b.listKeys(ctx, txn, at, prev.Keys, base+".keys", w, sets.add)
			if err == nil {
				err = sets.flush()
			}
			entry.Keys = keys
			return sets.version, err
		})
		if err != nil {
			return err
		}
		b.m.CopiedBytes += entry.Keys.Size
		b.m.CopiedFiles++
	}
	b.add(&entry, f)
	b.m.Rollups = append(b.m.Rollups, entry)
	b.report(Progress{Name: rollupsDir + "/" + name, Done: done, Total: total, Bytes: f.Size, Skipped: f.Path == ""})
	return nil
}

// newest writes, in Badger's backup format, the items above since that
// are not deleted, and keeps the highest version written.
type newest struct {
	w       io.Writer
	since   uint64
	version uint64
	list    pb.KVList
	size    int
}

func (n *newest) add(item *badger.Item) error {
	if item.Version() <= n.since || item.IsDeletedOrExpired() {
		return nil
	}
	v, err := item.ValueCopy(nil)
	if err != nil {
		return err
	}
	n.list.Kv = append(n.list.Kv, &pb.KV{Key: item.KeyCopy(nil), Value: v, Version: item.Version(),
		UserMeta: []byte{item.UserMeta()}, ExpiresAt: item.ExpiresAt()})
	n.version = max(n.version, item.Version())
	if n.size += len(v); len(n.list.Kv) < deletionsPerList && n.size < 4<<20 {
		return nil
	}
	return n.flush()
}

func (n *newest) flush() error {
	if len(n.list.Kv) == 0 {
		return nil
	}
	err := writeKVList(n.w, &n.list)
	n.list.Kv, n.size = n.list.Kv[:0], 0
	return err
}
