package natsembed

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/minio/highwayhash"
)

// A stream's metadata is two files: meta.inf (its configuration) and
// meta.sum (a checksum of meta.inf), written one after the other, each
// through a temporary file renamed over the old one. A power cut can
// keep one and not the other: a complete meta.inf with an empty or
// older meta.sum. The server then skips the stream at start; the
// service creates it again over the same message blocks, but as a new
// stream, and it does not rewrite meta.sum while meta.inf is there, so
// every later start skips it again and the consumer reads the whole
// stream again each time. Before the server starts, repairStreamSums
// writes the checksum of each stream whose meta.inf is complete JSON
// and whose meta.sum does not match it. A meta.inf that is empty or
// torn is left alone: the server skips that stream, and creating it
// again writes both files.

// Names of the server's files (nats-server's JetStreamMetaFile,
// JetStreamMetaFileSum, JetStreamMetaFileKey).
const (
	streamMetaFile = "meta.inf"
	streamMetaSum  = "meta.sum"
	streamMetaKey  = "meta.key"
)

// repairStreamSums repairs the checksums of the streams under storeDir
// (the server's StoreDir: <storeDir>/jetstream/<account>/streams/<stream>)
// and returns the streams it repaired. Encrypted streams (meta.key) are
// left alone.
func repairStreamSums(storeDir string, log *slog.Logger) ([]string, error) {
	accounts, err := os.ReadDir(filepath.Join(storeDir, "jetstream"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var repaired []string
	for _, acc := range accounts {
		if !acc.IsDir() {
			continue
		}
		sdir := filepath.Join(storeDir, "jetstream", acc.Name(), "streams")
		streams, err := os.ReadDir(sdir)
		if err != nil {
			continue // an account without streams
		}
		for _, st := range streams {
			if !st.IsDir() || strings.HasPrefix(st.Name(), ".") {
				continue // a stream being deleted
			}
			ok, err := repairStreamSum(filepath.Join(sdir, st.Name()), st.Name())
			if err != nil {
				return repaired, fmt.Errorf("stream %s of account %s: %w", st.Name(), acc.Name(), err)
			}
			if ok {
				log.Warn("stream metadata checksum did not match its configuration (a power cut between their writes); rewrote it so the stream is recovered",
					"account", acc.Name(), "stream", st.Name())
				repaired = append(repaired, acc.Name()+"/"+st.Name())
			}
		}
	}
	return repaired, nil
}

// repairStreamSum rewrites dir's meta.sum when it does not match a
// complete meta.inf; it reports whether it did.
func repairStreamSum(dir, name string) (bool, error) {
	if _, err := os.Stat(filepath.Join(dir, streamMetaKey)); err == nil {
		return false, nil
	}
	inf, err := os.ReadFile(filepath.Join(dir, streamMetaFile))
	if err != nil || len(inf) == 0 || !json.Valid(inf) {
		return false, nil
	}
	want, err := streamMetaChecksum(name, inf)
	if err != nil {
		return false, err
	}
	have, err := os.ReadFile(filepath.Join(dir, streamMetaSum))
	if err == nil && bytes.Equal(have, want) {
		return false, nil
	}
	if err := writeSynced(filepath.Join(dir, streamMetaSum), want); err != nil {
		return false, err
	}
	return true, nil
}

// streamMetaChecksum is the server's checksum of a stream's meta.inf:
// HighwayHash-64 keyed with the SHA-256 of the stream's name, in hex.
func streamMetaChecksum(name string, inf []byte) ([]byte, error) {
	key := sha256.Sum256([]byte(name))
	h, err := highwayhash.New64(key[:])
	if err != nil {
		return nil, err
	}
	h.Write(inf)
	return []byte(hex.EncodeToString(h.Sum(nil))), nil
}

// writeSynced replaces path with data durably: a temporary file,
// fsynced, renamed over path, and the directory fsynced.
func writeSynced(path string, data []byte) error {
	tmp := path + ".repair"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o640)
	if err != nil {
		return err
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	cerr := f.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return syncPath(filepath.Dir(path))
}

// A consumer's metadata is meta.inf and meta.sum beside its state
// (o.dat). The server writes a consumer's meta.inf only when the file
// does not exist, and skips at start a consumer whose meta.inf is not
// complete JSON. A power cut soon after a consumer was created keeps
// the file (creating it is on disk at once) and loses its contents:
// the server skips the consumer, its owner creates it again, the server
// finds the empty meta.inf there and keeps it, and every later start
// skips the consumer again. Each consumer created again also takes over
// the old one's state from o.dat: what it had delivered, what was
// pending and how often each pending message had been delivered, so
// the counts grow over starts until messages reach the consumer's
// MaxDeliver and are dead-lettered without a failed write. Before the
// server starts, removeBrokenConsumers removes each consumer whose
// meta.inf is not complete JSON or whose meta.sum is missing (the
// server would skip it): its owner creates it again from nothing.

// removeBrokenConsumers removes, under storeDir (as repairStreamSums),
// every consumer the server would skip for its metadata, and returns
// them as account/stream/consumer. Encrypted consumers (meta.key) are
// left alone.
func removeBrokenConsumers(storeDir string, log *slog.Logger) ([]string, error) {
	obs, err := filepath.Glob(filepath.Join(storeDir, "jetstream", "*", "streams", "*", "obs", "*"))
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, dir := range obs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || !consumerMetaBroken(dir) {
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			return removed, fmt.Errorf("remove consumer %s: %w", dir, err)
		}
		if err := syncPath(filepath.Dir(dir)); err != nil {
			return removed, err
		}
		rel, _ := filepath.Rel(filepath.Join(storeDir, "jetstream"), dir)
		parts := strings.Split(filepath.ToSlash(rel), "/") // account, "streams", stream, "obs", consumer
		name := rel
		if len(parts) == 5 {
			name = parts[0] + "/" + parts[2] + "/" + parts[4]
		}
		log.Warn("consumer metadata incomplete (a power cut after the consumer was created); removed the consumer so that its owner creates it again",
			"consumer", name)
		removed = append(removed, name)
	}
	return removed, nil
}

// consumerMetaBroken reports whether the server would skip the consumer
// in dir for its metadata: meta.inf missing, empty or not JSON, or
// meta.sum missing.
func consumerMetaBroken(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, streamMetaKey)); err == nil {
		return false
	}
	inf, err := os.ReadFile(filepath.Join(dir, streamMetaFile))
	if err != nil || len(inf) == 0 || !json.Valid(inf) {
		return true
	}
	_, err = os.Stat(filepath.Join(dir, streamMetaSum))
	return err != nil
}
