package backup

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4"

	"github.com/telemetryd/telemetryd/buckets"
	"github.com/telemetryd/telemetryd/store/rollup"
)

// loadPendingWrites is how many batches a restore keeps in flight per
// database.
const loadPendingWrites = 16

// RestoreOptions configures Restore.
type RestoreOptions struct {
	// Progress, if set, is called after each database is loaded.
	Progress func(Progress)
	// Logger receives Badger's messages (nil: slog.Default()).
	Logger *slog.Logger
	// Keep names entries the data directory may already hold (such as
	// a NATS server's store kept beside the data), which Restore leaves
	// alone; any other entry makes it refuse the directory.
	Keep []string
}

// Target is the data directory a restore fills, declared here so that
// the store keeps its layout and its state files to itself.
type Target interface {
	// Prepare creates the directories the databases go in.
	Prepare() error
	// Create creates the empty database that t, an entry of the
	// manifest, is restored into: the device index (t.Day and t.Rollup
	// empty), a day table (t.Day) or a rollup period (t.Rollup, a name
	// Verify checked).
	Create(t Table) (*badger.DB, error)
	// Finish writes what the store keeps beside its databases: m's
	// stream positions and tombstones, and a marker saying that the
	// directory was restored.
	Finish(m Manifest) error
	// Clean removes everything the restore wrote.
	Clean()
}

// Restore rebuilds a data directory, dataDir, from the newest backup in
// from, through to. dataDir must not exist or be empty. Every file is
// checked against its manifest before anything is written (ErrCorrupt
// names the first that differs); then each table and the index are
// loaded, full copy first and incremental ones in order, and to
// writes the stream positions and tombstones, so a store opened on
// dataDir resumes the stream past the positions. The rollup period
// databases are loaded after the tables.
func Restore(ctx context.Context, from, dataDir string, to Target, opts RestoreOptions) (Manifest, error) {
	m, err := ReadManifest(from)
	if err != nil {
		return Manifest{}, fmt.Errorf("restore: %w", err)
	}
	if err := checkEmptyDir(dataDir, opts.Keep); err != nil {
		return m, err
	}
	if err := Verify(ctx, from, m); err != nil {
		return m, err
	}
	if err := load(ctx, from, to, m, opts); err != nil {
		// Leave the directory as it was found, so a retry can start over.
		to.Clean()
		return m, err
	}
	return m, nil
}

// load loads every database of m into to and writes the state files.
func load(ctx context.Context, from string, to Target, m Manifest, opts RestoreOptions) error {
	if err := to.Prepare(); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	total := len(m.Tables) + 1 + len(m.Rollups)
	report := func(p Progress) {
		if opts.Progress != nil {
			opts.Progress(p)
		}
	}
	create := func(t Table) func() (*badger.DB, error) {
		return func() (*badger.DB, error) { return to.Create(t) }
	}
	if err := LoadDB(ctx, from, create(m.Index), m.Index.Files); err != nil {
		return fmt.Errorf("restore device index: %w", err)
	}
	report(Progress{Name: "index", Done: 1, Total: total, Bytes: m.Index.Bytes()})
	for i, t := range m.Tables {
		if err := LoadDB(ctx, from, create(t), t.Files); err != nil {
			return fmt.Errorf("restore table %s: %w", t.Day, err)
		}
		report(Progress{Name: t.Day, Done: i + 2, Total: total, Bytes: t.Bytes()})
	}
	for i, t := range m.Rollups {
		err := checkRollupName(t.Rollup)
		if err == nil {
			err = LoadDB(ctx, from, create(t), t.Files)
		}
		if err != nil {
			return fmt.Errorf("restore rollup %s: %w", t.Rollup, err)
		}
		report(Progress{Name: rollupsDir + "/" + t.Rollup, Done: len(m.Tables) + i + 2, Total: total, Bytes: t.Bytes()})
	}
	if err := to.Finish(m); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	return nil
}

// checkEmptyDir refuses a dataDir that holds anything but keep.
func checkEmptyDir(dataDir string, keep []string) error {
	entries, err := os.ReadDir(dataDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	for _, e := range entries {
		if !slices.Contains(keep, e.Name()) {
			return fmt.Errorf("restore: data directory %s is not empty (it holds %s); restore only into an empty or new directory", dataDir, e.Name())
		}
	}
	return nil
}

// Verify checks every file m lists in the backup directory from
// against its size and SHA-256.
func Verify(ctx context.Context, from string, m Manifest) error {
	all := append(append([]Table{m.Index}, m.Tables...), m.Rollups...)
	for i, t := range all {
		switch {
		case i > len(m.Tables):
			if err := checkRollupName(t.Rollup); err != nil {
				return fmt.Errorf("restore: %s: %w", from, err)
			}
		case i > 0:
			if d, err := buckets.ParseDay(t.Day); err != nil || d.String() != t.Day {
				return fmt.Errorf("restore: manifest of %s lists a table %q that is not a day", from, t.Day)
			}
		}
		files := t.Files
		if t.Keys != nil {
			files = append(slices.Clip(files), *t.Keys)
		}
		for _, f := range files {
			if !filepath.IsLocal(filepath.FromSlash(f.Path)) {
				return fmt.Errorf("restore: manifest of %s lists a file %q outside the backup directory", from, f.Path)
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := VerifyFile(from, f); err != nil {
				return err
			}
		}
	}
	return nil
}

// VerifyFile checks the file f of the backup directory from against
// its size and SHA-256 (ErrCorrupt when they differ).
func VerifyFile(from string, f File) error {
	path := filepath.Join(from, filepath.FromSlash(f.Path))
	in, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("restore: %w: %s: %w", ErrCorrupt, path, err)
	}
	defer in.Close()
	h := sha256.New()
	n, err := io.Copy(h, in)
	if err != nil {
		return fmt.Errorf("restore: read %s: %w", path, err)
	}
	if n != f.Size {
		return fmt.Errorf("restore: %w: %s is %d bytes, the manifest says %d", ErrCorrupt, path, n, f.Size)
	}
	if sum := hex.EncodeToString(h.Sum(nil)); sum != f.SHA256 {
		return fmt.Errorf("restore: %w: %s has SHA-256 %s, the manifest says %s", ErrCorrupt, path, sum, f.SHA256)
	}
	return nil
}

// LoadDB creates a database with create, loads the backup files into
// it in order and closes it.
func LoadDB(ctx context.Context, from string, create func() (*badger.DB, error), files []File) error {
	db, err := create()
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return errors.Join(err, db.Close())
		}
		if err := loadFile(db, filepath.Join(from, filepath.FromSlash(f.Path))); err != nil {
			return errors.Join(fmt.Errorf("load %s: %w", f.Path, err), db.Close())
		}
	}
	return db.Close()
}

func loadFile(db *badger.DB, path string) error {
	in, err := os.Open(path)
	if err != nil {
		return err
	}
	defer in.Close()
	return db.Load(in, loadPendingWrites)
}

// checkRollupName checks the name of a rollup period in a manifest.
func checkRollupName(name string) error {
	if _, _, err := rollup.ParsePeriodName(name); err != nil || strings.Contains(name, "\\") {
		return fmt.Errorf("manifest lists a rollup %q that is not <level>/YYYY-MM", name)
	}
	return nil
}
