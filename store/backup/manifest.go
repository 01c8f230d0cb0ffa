// Package backup copies a store's Badger databases (its day tables, its
// device index and its rollup period databases) into a backup
// directory, incrementally against the previous backup there, and
// restores a data directory from the newest one. It owns the layout of
// a backup directory and its manifest; the store hands it its
// databases through Source and Target, and keeps its own state files.
package backup

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"
)

// A backup directory holds a chain of backups of one data directory:
//
//	MANIFEST.json          the newest backup's manifest (replaced atomically)
//	LOCK                   flock held while a backup writes here
//	000001/                the first backup: a full copy
//	    manifest.json      its manifest
//	    index.kv           the device index (Badger backup format), in full
//	    tables/DAY.kv      one file per day table
//	    tables/DAY.keys    the keys of the table (keys.go)
//	    rollups/LEVEL/YYYY-MM.kv, .keys
//	                       one rollup period database and its keys
//	                       (rollups.go)
//	000002/                a later backup: only what changed since 000001
//
// A manifest lists, per day table and for the index, every file a
// restore loads, in order: for a table the full copy, then each
// incremental one (the entries with a version above the one the
// previous file reached, and the deletion of every key the previous
// backup listed that the table no longer holds). So the newest
// manifest alone describes a restore, and a table dropped since an
// older backup is simply not in it. A table that did not change is not
// copied again.
//
// Consistency: the stream positions are read first, then the index and
// each table are copied, each at one snapshot (Badger's version of its
// last completed commit). Every reading a saved position vouches for was
// committed before the position was saved, so it is in the copy; the
// copy may hold newer readings too, and a replay from the positions
// writes those again, which changes nothing.

// Format is the newest format version of the backup manifests
// this build writes and reads: format 2 lists rollup databases. A
// backup without rollups is written as format 1 (formatTables),
// which builds from before the rollups read too; one with rollups is
// refused by them rather than restored without its rollups.
const Format = 2

// formatTables is the format of a manifest without rollups.
const formatTables = 1

// File names in a backup directory.
const (
	manifestName = "MANIFEST.json"
	lockName     = "LOCK"
	indexName    = "index.kv"
	tablesDir    = "tables"
	rollupsDir   = "rollups"
)

// backupReaders is how many goroutines read a table for its copy.
const backupReaders = 2

// ErrCorrupt is wrapped by Restore when a file of the backup does
// not match its manifest.
var ErrCorrupt = errors.New("backup file does not match its manifest")

// Manifest describes one backup and everything a restore from it
// loads.
type Manifest struct {
	Format  int       `json:"format"`
	ID      int       `json:"id"`
	Created time.Time `json:"created"`
	// Positions are the stream positions the copy is consistent with:
	// the copy holds every message up to them (and maybe later ones).
	Positions map[string]Position `json:"positions"`
	// Tombstones are the days dropped before the backup, with when.
	Tombstones map[string]time.Time `json:"tombstones"`
	Index      Table                `json:"index"`
	Tables     []Table              `json:"tables"`
	// Rollups are the rollup period databases (rollups.go).
	Rollups []Table `json:"rollups,omitempty"`
	// CopiedBytes and CopiedFiles are what this backup wrote; Skipped
	// counts the tables that had not changed since the previous one.
	CopiedBytes int64 `json:"copied_bytes"`
	CopiedFiles int   `json:"copied_files"`
	Skipped     int   `json:"skipped_tables"`
}

// Position is the position of one stream in a manifest.
type Position struct {
	Created time.Time `json:"created"`
	Seq     uint64    `json:"seq"`
}

// Table is one database in a manifest: a day table (Day set), a
// rollup period (Rollup set: "<level>/YYYY-MM") or the device index.
type Table struct {
	Day    string `json:"day,omitempty"`
	Rollup string `json:"rollup,omitempty"`
	// Version is the Badger version the copy reached: the next
	// incremental copy takes the entries above it.
	Version uint64 `json:"version"`
	// Inode identifies the table's directory, so a table dropped and
	// written again since the previous backup is copied in full.
	Inode uint64 `json:"inode,omitempty"`
	Files []File `json:"files"`
	// Keys, of a day table, lists the keys the table held at Version
	// (keys.go): the next incremental copy deletes those it no
	// longer holds. A restore does not read it.
	Keys *File `json:"keys,omitempty"`
}

// File is one file of a backup, relative to the backup directory.
type File struct {
	Path string `json:"path"`
	// Since is 0 for a full copy; an incremental one holds the entries
	// with versions above it.
	Since   uint64 `json:"since"`
	Version uint64 `json:"version"`
	Size    int64  `json:"size"`
	SHA256  string `json:"sha256"`
}

// Bytes is the total size of the files a restore of t loads.
func (t Table) Bytes() int64 {
	var n int64
	for _, f := range t.Files {
		n += f.Size
	}
	return n
}

// TotalBytes is what a restore of m loads: the device index, every
// table and every rollup period, all their files.
func (m Manifest) TotalBytes() int64 {
	n := m.Index.Bytes()
	for _, t := range append(slices.Clip(m.Tables), m.Rollups...) {
		n += t.Bytes()
	}
	return n
}

// Sequences are the stream positions of m: stream -> last sequence the
// backup holds.
func (m Manifest) Sequences() map[string]uint64 {
	seqs := make(map[string]uint64, len(m.Positions))
	for name, p := range m.Positions {
		seqs[name] = p.Seq
	}
	return seqs
}

// Progress reports one step of a backup or a restore.
type Progress struct {
	// Name is the database: a day ("2026-11-25"), "index" or a rollup
	// period ("rollups/1m/2026-11").
	Name string
	// Done and Total count the databases.
	Done, Total int
	// Bytes is what the step copied or loaded; Skipped says the table
	// had not changed.
	Bytes   int64
	Skipped bool
}

// Options configures Run.
type Options struct {
	// Full copies everything even when the directory holds an earlier
	// backup (starting a new chain).
	Full bool
	// Progress, if set, is called after each database.
	Progress func(Progress)
	// Now is the clock of the manifest's Created time (nil: time.Now).
	Now func() time.Time
	// Logger receives the warnings of the backup (nil: slog.Default()).
	Logger *slog.Logger
}

// ID formats a backup's ID as its subdirectory name.
func ID(id int) string { return fmt.Sprintf("%06d", id) }
