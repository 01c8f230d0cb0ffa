// Package cliflag holds what the commands share in parsing their
// flags: the environment binding (a variable for every flag, the
// command line winning), the byte-size flag type, the flag list of -h
// and the -version line.
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/dustin/go-humanize"
)

// EnvName is the environment variable of a flag: prefix, then the flag
// name in upper case with '-' as '_' (EnvName("TELEMETRY_", "nats-url")
// is TELEMETRY_NATS_URL).
func EnvName(prefix, flag string) string {
	return prefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// ApplyEnv sets every flag of fs that the command line did not set
// from its environment variable (EnvName), when that is not empty. fs
// must have parsed its arguments; arguments left over are an error.
// Each bad value is reported with its variable.
func ApplyEnv(fs *flag.FlagSet, prefix string, getenv func(string) string) error {
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		env := EnvName(prefix, f.Name)
		if v := getenv(env); v != "" && !set[f.Name] {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// SetUsage makes fs print head, then every flag with its type, meaning,
// default and environment variable (none for the flags named in
// noEnv).
func SetUsage(fs *flag.FlagSet, head, prefix string, noEnv ...string) {
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprint(w, head)
		PrintFlags(w, fs, prefix, noEnv...)
	}
}

// PrintFlags lists the flags of fs: name, type (FlagType), meaning,
// default and environment variable (EnvName; none for noEnv).
func PrintFlags(w io.Writer, fs *flag.FlagSet, prefix string, noEnv ...string) {
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := FlagType(f)
		line := "  -" + f.Name
		if typ != "" {
			line += " " + typ
		}
		if !slices.Contains(noEnv, f.Name) {
			line += "   [" + EnvName(prefix, f.Name) + "]"
		}
		fmt.Fprintln(w, line)
		fmt.Fprintf(w, "    \t%s", strings.ReplaceAll(usage, "\n", "\n    \t"))
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "0" {
			if typ == "string" {
				fmt.Fprintf(w, " (default %q)", f.DefValue)
			} else {
				fmt.Fprintf(w, " (default %s)", f.DefValue)
			}
		}
		fmt.Fprintln(w)
	})
}

// FlagType is flag.UnquoteUsage with byte sizes (ByteSize) named
// "size".
func FlagType(f *flag.Flag) (typ, usage string) {
	typ, usage = flag.UnquoteUsage(f)
	if _, ok := f.Value.(ByteSize); ok {
		typ = "size"
	}
	return typ, usage
}

// ByteSize is a flag.Value of a byte count written as 512MiB, 4GiB, 1GB
// or a plain number of bytes. Every size flag uses it, so all accept
// the same forms.
type ByteSize struct{ n *int64 }

// Size returns the ByteSize flag value stored in n.
func Size(n *int64) ByteSize { return ByteSize{n: n} }

// String is the size in its largest exact binary unit (FormatBytes).
func (s ByteSize) String() string {
	if s.n == nil {
		return "0"
	}
	return FormatBytes(*s.n)
}

// Set parses v.
func (s ByteSize) Set(v string) error {
	n, err := humanize.ParseBytes(v)
	if err != nil {
		return fmt.Errorf("want a size such as 512MiB, 4GiB or a number of bytes: %w", err)
	}
	if n > 1<<62 {
		return fmt.Errorf("size %s is too large", v)
	}
	*s.n = int64(n)
	return nil
}

// FormatBytes writes n in the largest binary unit that divides it
// (1GiB, 512MiB; 1000 bytes as 1000), a form ByteSize accepts.
func FormatBytes(n int64) string {
	for _, u := range []struct {
		size int64
		name string
	}{{1 << 40, "TiB"}, {1 << 30, "GiB"}, {1 << 20, "MiB"}, {1 << 10, "KiB"}} {
		if n != 0 && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.name)
		}
	}
	return fmt.Sprintf("%d", n)
}

// Set at link time by deploy/install.sh (go install -ldflags "-X
// ...cliflag.version=v1.2.0 -X ...cliflag.commit=<hash>"), so a build
// names its commit where Go does not record one (GOFLAGS=-buildvcs=false,
// a source tree without .git).
var (
	version    string
	commit     string
	commitTime string
)

// Build is a binary's version and commit: those set at link time win;
// otherwise they come from the module version and the VCS stamp Go
// records, when it records them. -version prints it and the service's
// /api/v1/status/buildinfo reports it.
type Build struct {
	Version string // "(devel)" when neither names one
	Commit  string // the full hash; empty when unknown
	Time    string // the commit's time (RFC 3339); empty when unknown
	Dirty   bool   // built from a tree with uncommitted changes
}

// BuildOf returns this binary's Build.
func BuildOf() Build {
	b := Build{Version: "(devel)"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			b.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				b.Commit = s.Value
			case "vcs.time":
				b.Time = s.Value
			case "vcs.modified":
				b.Dirty = s.Value == "true"
			}
		}
	}
	if version != "" {
		b.Version = version
	}
	if commit != "" {
		b.Commit, b.Time, b.Dirty = strings.TrimSuffix(commit, "-dirty"), commitTime, strings.HasSuffix(commit, "-dirty")
	}
	return b
}

// Version is what -version prints for the binary called name: its
// version, the commit and its time, and the Go version (BuildOf).
func Version(name string) string {
	b := BuildOf()
	out := name + " " + b.Version
	if b.Commit != "" {
		out += " " + b.Commit[:min(12, len(b.Commit))]
		if b.Dirty {
			out += "-dirty"
		}
		if b.Time != "" {
			out += " " + b.Time
		}
	}
	return out + " " + runtime.Version()
}
