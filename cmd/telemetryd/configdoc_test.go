package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telemetryd/telemetryd/cmd/internal/authcli"
	"github.com/telemetryd/telemetryd/cmd/internal/cliflag"
	"github.com/telemetryd/telemetryd/cmd/internal/exportcli"
	"github.com/telemetryd/telemetryd/cmd/internal/flagdoc"
)

// The configuration reference, CONFIGURATION.md beside this file, is
// generated from the flag definitions, so it cannot drift from -h:
// TestConfigurationReference fails when the file differs from what the
// flags say, and rewrites it when TELEMETRY_UPDATE_DOCS=1:
//
//	TELEMETRY_UPDATE_DOCS=1 go test ./cmd/telemetryd -run TestConfigurationReference

const configDocFile = "CONFIGURATION.md"

// Markers around the generated part; the text outside them is written
// by hand.
const (
	configDocBegin = "<!-- generated from the flag definitions: do not edit below -->"
	configDocEnd   = "<!-- end of generated part -->"
)

func TestConfigurationReference(t *testing.T) {
	inLane(t, lanes.general)
	b, err := os.ReadFile(configDocFile)
	require.NoError(t, err)
	doc := string(b)
	start, end := strings.Index(doc, configDocBegin), strings.Index(doc, configDocEnd)
	require.True(t, start >= 0 && end > start, "%s has the generated-part markers", configDocFile)
	want := doc[:start+len(configDocBegin)] + "\n" + configReference() + doc[end:]
	if os.Getenv("TELEMETRY_UPDATE_DOCS") == "1" {
		require.NoError(t, os.WriteFile(configDocFile, []byte(want), 0o644))
		return
	}
	assert.Equal(t, want, doc, "%s is out of date: run TELEMETRY_UPDATE_DOCS=1 go test ./cmd/telemetryd -run TestConfigurationReference", configDocFile)
}

// TestServiceFlags: -h lists at most 30 flags, the fleet's; every
// flag of the service, listed or tuning, says who needs it.
func TestServiceFlags(t *testing.T) {
	inLane(t, lanes.general)
	fs := serviceFlagSet()
	fs.VisitAll(func(f *flag.Flag) {
		assert.True(t, flagdoc.Known(f.Name), "-%s: say in package flagdoc who needs it", f.Name)
	})
	var help bytes.Buffer
	fs.SetOutput(&help)
	setServiceUsage(fs)
	fs.Usage()
	listed := 0
	for line := range strings.Lines(help.String()) {
		if strings.HasPrefix(line, "  -") {
			listed++
		}
	}
	fleet, tuning := flagdoc.Split(fs)
	n := 0
	fleet.VisitAll(func(*flag.Flag) { n++ })
	assert.Equal(t, n, listed, "-h lists the fleet's flags:\n%s", help.String())
	assert.LessOrEqual(t, listed, 30, "telemetryd -h lists at most 30 flags")
	assert.NotNil(t, tuning.Lookup("hot-days"), "tuning settings are still flags")
	assert.Nil(t, fleet.Lookup("hot-days"))
}

// configReference renders every flag of telemetryd and its subcommands
// as markdown tables.
func configReference() string {
	var b strings.Builder
	fleet, tuning := flagdoc.Split(serviceFlagSet())
	b.WriteString("\n## telemetryd\n\n")
	flagTable(&b, fleet, true)
	b.WriteString("\n## Tuning\n\n")
	flagTable(&b, tuning, true)
	b.WriteString("\n## telemetryd retention\n\n")
	ret := retentionFlags()
	flagTable(&b, ret, true)
	b.WriteString("\n## telemetryd export\n\n")
	flagTable(&b, exportcli.FlagSet(io.Discard, shared(os.Getenv, io.Discard)), true)
	b.WriteString("\n## telemetryd auth\n\n")
	flagTable(&b, authcli.FlagSet(io.Discard), false)
	b.WriteString("\n")
	return b.String()
}

// flagTable writes one row per flag of fs: name, variable (when env),
// default and meaning, as -h prints them.
func flagTable(b *strings.Builder, fs *flag.FlagSet, env bool) {
	who := fs.Name() == "telemetryd" || fs.Name() == "telemetryd tuning"
	if who {
		b.WriteString("| flag | variable | default | meaning | who needs it |\n|---|---|---|---|---|\n")
	} else if env {
		b.WriteString("| flag | variable | default | meaning |\n|---|---|---|---|\n")
	} else {
		b.WriteString("| flag | default | meaning |\n|---|---|---|\n")
	}
	fs.VisitAll(func(f *flag.Flag) {
		typ, usage := cliflag.FlagType(f)
		name := "`-" + f.Name + "`"
		if typ != "" {
			name = "`-" + f.Name + " " + typ + "`"
		}
		def := "`" + f.DefValue + "`"
		if f.DefValue == "" {
			def = "empty"
		}
		usage = strings.ReplaceAll(strings.ReplaceAll(usage, "|", `\|`), "\n", " ")
		if env {
			variable := "`" + envName(f.Name) + "`"
			if f.Name == "version" {
				variable = ""
			}
			if who {
				fmt.Fprintf(b, "| %s | %s | %s | %s | %s |\n", name, variable, def, usage, flagdoc.Who(f.Name))
				return
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", name, variable, def, usage)
			return
		}
		fmt.Fprintf(b, "| %s | %s | %s |\n", name, def, usage)
	})
}
