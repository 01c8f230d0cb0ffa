// Package rules evaluates Prometheus rule files (recording and alerting
// groups) on the service's own data through its PromQL engine, keeps
// the state of every alert (pending, firing, resolved), restores it
// after a restart, sends alerts to Alertmanager (API v2) and plain
// webhooks, and serves /api/v1/rules and /api/v1/alerts in Prometheus'
// shapes. README.md in this directory is its reference.
package rules

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"

	"github.com/telemetryd/telemetryd/buckets"
)

// Bounds of what Load accepts.
const (
	// MaxFileBytes is the largest rule file Load reads.
	MaxFileBytes = 4 << 20
	// MaxRules is the most rules all files together may hold.
	MaxRules = 5000
	// MaxFiles is the most files the globs may name.
	MaxFiles = 1000
	// MinInterval is the shortest evaluation interval a group may have.
	MinInterval = time.Second
	// DefaultInterval is the interval of a group that names none.
	DefaultInterval = time.Minute
)

// Group is one loaded rule group.
type Group struct {
	File     string
	Name     string
	Interval time.Duration
	Limit    int
	Labels   labels.Labels
	Rules    []*Rule
}

// Key identifies a group across reloads, restarts and nodes: its name
// (Load refuses two groups of one name, whatever their files).
func (g *Group) Key() string { return g.Name }

// Rule is one recording or alerting rule.
type Rule struct {
	// Record is the name of a recording rule's result, Alert the name
	// of an alerting rule; exactly one is set.
	Record, Alert string
	Expr          string
	For           time.Duration
	KeepFiringFor time.Duration
	Labels        labels.Labels
	Annotations   labels.Labels
}

// Name is the rule's record or alert name.
func (r *Rule) Name() string {
	if r.Alert != "" {
		return r.Alert
	}
	return r.Record
}

// Load reads every file the globs match (sorted, each once) and returns
// their groups, or an error naming each bad file with the line, group
// and rule of each problem. A glob that matches nothing is an error.
func Load(globs []string, defaultInterval time.Duration) ([]*Group, error) {
	if defaultInterval <= 0 {
		defaultInterval = DefaultInterval
	}
	var files []string
	for _, g := range globs {
		m, err := filepath.Glob(g)
		if err != nil {
			return nil, fmt.Errorf("rules %q: %w", g, err)
		}
		if len(m) == 0 {
			return nil, fmt.Errorf("rules %q: no file matches", g)
		}
		files = append(files, m...)
	}
	slices.Sort(files)
	files = slices.Compact(files)
	if len(files) > MaxFiles {
		return nil, fmt.Errorf("rules: %d files, more than %d", len(files), MaxFiles)
	}
	var (
		groups []*Group
		errs   []error
		n      int
		seen   = map[string]string{}
	)
	for _, f := range files {
		gs, err := loadFile(f, defaultInterval)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, g := range gs {
			if prev, ok := seen[g.Name]; ok {
				errs = append(errs, fmt.Errorf("%s: group %q: the name is taken by a group of %s; group names must be unique", f, g.Name, prev))
				continue
			}
			seen[g.Name] = f
			n += len(g.Rules)
			groups = append(groups, g)
		}
		if n > MaxRules {
			return nil, fmt.Errorf("rules: more than %d rules (at %s); split them over fewer, broader rules", MaxRules, f)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return groups, nil
}

// loadFile parses and checks one file.
func loadFile(path string, defaultInterval time.Duration) ([]*Group, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes; split it into several files", path, MaxFileBytes)
	}
	if n := strings.Count(string(b), "expr:"); n > MaxRules {
		// Checked before parsing, so a huge file costs no PromQL parses.
		return nil, fmt.Errorf("%s: %d rules, more than %d", path, n, MaxRules)
	}
	rgs, errs := rulefmt.Parse(b, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	if len(errs) > 0 {
		for i := range errs {
			errs[i] = fmt.Errorf("%s: %w", path, errs[i])
		}
		return nil, errors.Join(errs...)
	}
	var out []*Group
	for _, rg := range rgs.Groups {
		g := &Group{File: path, Name: rg.Name, Interval: time.Duration(rg.Interval), Limit: rg.Limit,
			Labels: labels.FromMap(rg.Labels)}
		if g.Interval == 0 {
			g.Interval = defaultInterval
		}
		if g.Interval < MinInterval {
			return nil, fmt.Errorf("%s: group %q: interval %s is shorter than %s", path, rg.Name, g.Interval, MinInterval)
		}
		for i, r := range rg.Rules {
			if r.Record != "" {
				if err := buckets.ValidateValueName(r.Record); err != nil {
					return nil, fmt.Errorf("%s: group %q, rule %d, %q: a recording rule's result is stored as a value of that name: %w", path, rg.Name, i+1, r.Record, err)
				}
			}
			g.Rules = append(g.Rules, &Rule{Record: r.Record, Alert: r.Alert, Expr: r.Expr,
				For: time.Duration(r.For), KeepFiringFor: time.Duration(r.KeepFiringFor),
				Labels: labels.FromMap(r.Labels), Annotations: labels.FromMap(r.Annotations)})
		}
		out = append(out, g)
	}
	return out, nil
}
