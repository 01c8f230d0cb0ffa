// Package flagdoc sorts the flags of the telemetryd service into the
// ones a fleet's operator sets, which `telemetryd -h` lists, and the
// tuning settings, which the configuration reference lists in a section
// of their own (cmd/telemetryd/CONFIGURATION.md, "Tuning"); and it says
// for each who needs it. Tuning settings are set like any flag, on the
// command line or by their TELEMETRY_* variable: they are kept out of
// -h, not out of reach.
package flagdoc

import (
	"flag"
	"sort"
)

// fleet are the flags `telemetryd -h` lists, with who needs each.
var fleet = map[string]string{
	"data-dir":            "every node: where its tables, index and embedded stream live",
	"http-addr":           "every node: where users, dashboards, line protocol writers and other nodes connect",
	"nats-listen":         "nodes running the embedded NATS server: where NATS devices connect",
	"mqtt-listen":         "fleets of MQTT devices on the embedded server",
	"nats-url":            "deployments with a NATS cluster of their own",
	"nats-creds":          "with -nats-url, when the NATS server takes JWT credentials",
	"nats-user":           "with -nats-url, when the NATS server takes a user and password",
	"nats-password":       "with -nats-url, when the NATS server takes a user and password",
	"auth-file":           "every deployment reachable beyond loopback: device secrets and API tokens",
	"insecure":            "trusted networks only: listeners beyond loopback without -auth-file",
	"tls-cert":            "deployments whose devices or users connect over networks they do not trust",
	"tls-key":             "with -tls-cert",
	"cursor-key":          "clusters (the same key on every node) and nodes whose cursors must outlive their data dir",
	"memory-limit":        "every node: the memory of its machine or container",
	"retention":           "every fleet: how long readings are kept",
	"retention-max-bytes": "nodes whose disk is smaller than -retention needs",
	"rollups":             "fleets that chart or alert over months",
	"sync-writes":         "operators choosing between surviving a power cut and write throughput",
	"rules":               "fleets that record or alert",
	"alertmanager-url":    "fleets that alert through Alertmanager",
	"alert-webhook-url":   "fleets that alert through a webhook",
	"partitions":          "clusters: set once, on every node",
	"node-name":           "clusters, where host names are not unique",
	"advertise-url":       "clusters: every node",
	"cluster-token":       "clusters: the same secret on every node",
	"copies":              "clusters that keep more or fewer than two copies",
	"log-level":           "every node",
	"log-format":          "nodes whose logs go to a collector (json)",
	"version":             "anyone asking which build runs",
}

// tuning says who needs each tuning setting.
var tuning = map[string]string{
	"subject-prefix":            "fleets sharing a NATS server with other subjects",
	"retention-interval":        "nodes whose retention must run more or less often",
	"max-future-skew":           "fleets whose device clocks run ahead",
	"intake":                    "measuring the fsync cost of the intake against the stream",
	"sync-interval":             "with -sync-writes=false: how much an ack may lose to a power cut",
	"stream-partitions":         "single nodes whose disk takes more or fewer parallel fsyncs",
	"stream-max-age":            "fleets whose ingest may stop for longer than a week",
	"stream-max-bytes":          "nodes whose disk must hold a longer replay buffer than start-up sizes",
	"rejected-max-bytes":        "fleets that keep more dead letters to inspect",
	"mqtt-stream-max-bytes":     "fleets of many MQTT sessions or QoS 2 messages",
	"disk-reserve":              "nodes on small disks",
	"pprof-addr":                "profiling a node",
	"shutdown-timeout":          "orchestrators with a shorter or longer stop grace period",
	"hot-days":                  "fleets that write much late data",
	"max-open-tables":           "query loads that read many old days at once",
	"column-cache":              "nodes short of memory that repeat few queries",
	"line-device-tags":          "line protocol writers that name the device in another tag",
	"line-tags":                 "line protocol writers whose tags are values, not attributes",
	"line-name-separator":       "line protocol writers that want climate.temp names",
	"max-write-bytes":           "line protocol writers that send larger bodies",
	"query-timeout":             "dashboards with heavier queries",
	"http-rate":                 "API clients that need a higher request rate",
	"http-burst":                "with -http-rate",
	"http-max-conns":            "nodes with many concurrent API clients",
	"http-max-conns-per-client": "many clients behind one address (a NAT, a proxy)",
	"backup-dir":                "online backups to another place, or none",
	"lease-ttl":                 "clusters that take over partitions faster or slower",
	"partition-streams":         "every cluster (the servers map the partitions); false for one whose NATS servers cannot map them yet",
	"stream-replicas":           "clusters whose NATS cluster has other than three servers",
	"alert-external-url":        "alerts that link back to the service",
	"alert-external-labels":     "alerts from several sites to one Alertmanager",
	"rule-query-slots":          "many or heavy rules",
}

// Fleet reports whether name is listed by -h.
func Fleet(name string) bool { _, ok := fleet[name]; return ok }

// Who says who needs the flag or setting name ("" for an unknown one).
func Who(name string) string {
	if w, ok := fleet[name]; ok {
		return w
	}
	return tuning[name]
}

// Known reports whether name is a flag or setting this package
// documents.
func Known(name string) bool { return Who(name) != "" }

// Split copies the flags of all into the fleet's (those -h lists) and
// the tuning settings, in name order; the copies share all's values.
func Split(all *flag.FlagSet) (fleetFlags, tuningFlags *flag.FlagSet) {
	fleetFlags = flag.NewFlagSet(all.Name(), flag.ContinueOnError)
	tuningFlags = flag.NewFlagSet(all.Name()+" tuning", flag.ContinueOnError)
	var names []string
	all.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	sort.Strings(names)
	for _, n := range names {
		f := all.Lookup(n)
		to := tuningFlags
		if Fleet(n) {
			to = fleetFlags
		}
		to.Var(f.Value, f.Name, f.Usage)
		to.Lookup(f.Name).DefValue = f.DefValue
	}
	return fleetFlags, tuningFlags
}
