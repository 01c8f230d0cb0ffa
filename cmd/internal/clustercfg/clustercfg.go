// Package clustercfg holds the scale-out flags of telemetryd
// (deploy/CLUSTER.md): their defaults, their checks and the cluster
// credential derived from them.
package clustercfg

import (
	"crypto/hkdf"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"time"

	"github.com/telemetryd/telemetryd/api/auth"
	"github.com/telemetryd/telemetryd/ingest/ownership"
	"github.com/telemetryd/telemetryd/ingest/partition"
)

// Config is the scale-out configuration. With Partitions 0 the service
// is a single node and nothing here applies.
type Config struct {
	Partitions     int
	Copies         int
	NodeName       string
	AdvertiseURL   string
	LeaseTTL       time.Duration
	ClusterToken   string // the cluster credential; default derived from -cursor-key
	StreamReplicas int
	// PartitionStreams gives each partition a stream of its own
	// (TELEMETRY_<p>), so that each has its own leader, file and fsync;
	// the NATS servers must map <prefix>.<device> to
	// <prefix>.<partition>.<device> (deploy/nats-cluster.conf). Default
	// on. Off: the one stream TELEMETRY applies the partition itself. A
	// single node has a stream per partition whatever it says.
	PartitionStreams bool
}

// DefaultStreamReplicas is the default of -stream-replicas.
const DefaultStreamReplicas = 3

// Default returns the cluster defaults: off (a single node); a cluster
// has a stream per partition.
func Default() Config {
	return Config{
		Copies:           ownership.DefaultCopies,
		LeaseTTL:         ownership.DefaultLeaseTTL,
		StreamReplicas:   DefaultStreamReplicas,
		PartitionStreams: true,
	}
}

// Bind registers the cluster flags on fs, with c's values as defaults.
func (c *Config) Bind(fs *flag.FlagSet) {
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "split the devices into this many partitions shared by the nodes of a cluster (0: a single node); fixed for the life of the stream")
	fs.IntVar(&c.Copies, "copies", c.Copies, "cluster: how many nodes store each partition")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "cluster: this node's unique name (empty: the host name)")
	fs.StringVar(&c.AdvertiseURL, "advertise-url", c.AdvertiseURL, "cluster: the HTTP base URL other nodes use to reach this one, e.g. http://node-1:8080")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", c.LeaseTTL, "cluster: a node whose lease is not renewed for this long is gone and its partitions are taken over")
	fs.StringVar(&c.ClusterToken, "cluster-token", c.ClusterToken, "cluster: the secret nodes present to each other's node-to-node API, the same on every node (at least 16 characters; not a token of the auth file); empty: derived from -cursor-key")
	fs.BoolVar(&c.PartitionStreams, "partition-streams", c.PartitionStreams, "cluster: a stream per partition (TELEMETRY_0, TELEMETRY_1, ...), each with its own leader and fsync, their leaders spread over the NATS servers; the servers must map <prefix>.* to <prefix>.{{partition(N,1)}}.{{wildcard(1)}} (deploy/nats-cluster.conf); a cluster on the one stream TELEMETRY drains it and removes it. false: the one stream TELEMETRY, partitioned by its subject transform, and no mapping on the servers")
	fs.IntVar(&c.StreamReplicas, "stream-replicas", c.StreamReplicas, "cluster: replicas of the streams and the lease bucket when a node creates them")
}

// Validate checks the cluster flags together with -nats-url and
// -cursor-key; an empty NodeName becomes the host name.
func (c *Config) Validate(natsURL, cursorKey string) error {
	if c.Partitions == 0 {
		return nil // a single node's streams follow -stream-partitions
	}
	var errs []error
	if c.NodeName == "" {
		host, err := os.Hostname()
		if err != nil {
			errs = append(errs, fmt.Errorf("-node-name: empty, and the host name is unknown: %w", err))
		}
		c.NodeName = host
	}
	if err := partition.Validate(c.Partitions); err != nil {
		errs = append(errs, fmt.Errorf("-partitions: %w", err))
	}
	if c.Copies < 1 || c.Copies > 5 {
		errs = append(errs, fmt.Errorf("-copies %d: want 1 to 5", c.Copies))
	}
	if err := ownership.ValidateNodeName(c.NodeName); err != nil {
		errs = append(errs, fmt.Errorf("-node-name: %w", err))
	}
	if u, err := url.Parse(c.AdvertiseURL); c.AdvertiseURL == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, fmt.Errorf("-advertise-url %q: a cluster node needs the http(s) base URL other nodes reach it at", c.AdvertiseURL))
	}
	if natsURL == "" {
		errs = append(errs, errors.New("-partitions: a cluster node needs -nats-url pointing at the NATS JetStream cluster (the embedded server is a single node)"))
	}
	if c.LeaseTTL < ownership.MinLeaseTTL {
		errs = append(errs, fmt.Errorf("-lease-ttl %s: want at least %s", c.LeaseTTL, ownership.MinLeaseTTL))
	}
	if c.StreamReplicas < 1 || c.StreamReplicas > 5 {
		errs = append(errs, fmt.Errorf("-stream-replicas %d: want 1 to 5", c.StreamReplicas))
	}
	if cursorKey == "" {
		errs = append(errs, errors.New("-partitions: a cluster node needs -cursor-key, the same on every node, so a cursor made by one node continues on any other"))
	}
	if c.ClusterToken != "" && len(c.ClusterToken) < auth.MinSecretLen {
		errs = append(errs, fmt.Errorf("-cluster-token has %d characters; use at least %d random ones (or leave it empty to derive one from -cursor-key)", len(c.ClusterToken), auth.MinSecretLen))
	}
	return errors.Join(errs...)
}

// credentialInfo separates the cluster credential derived from the
// cursor key from the cursor key itself.
const credentialInfo = "telemetryd cluster credential v1"

// Credential is the secret of node-to-node calls: -cluster-token, else
// one derived from cursorKey (-cursor-key, which every node of a
// cluster shares; the derivation does not reveal it). Never an API
// token: a node-to-node call reads any device for its caller, and an
// admin-only token may not read.
func (c Config) Credential(cursorKey string) (string, error) {
	if c.ClusterToken != "" {
		return c.ClusterToken, nil
	}
	key, err := hkdf.Key(sha256.New, []byte(cursorKey), nil, credentialInfo, 32)
	if err != nil {
		return "", fmt.Errorf("cluster credential: %w", err)
	}
	return hex.EncodeToString(key), nil
}
