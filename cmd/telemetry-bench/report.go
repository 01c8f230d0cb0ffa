package main

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Figures of the peer system measured on the same kind of machine:
// VictoriaMetrics ingesting the same 3-value readings for 1,000 devices
// over its HTTP line protocol. It acknowledges writes before they are
// durable; telemetryd acks only after the Badger commit.
const (
	peerRate10000 = 340_000 // readings/s in 10,000-line requests
	peerRate100   = 190_000 // readings/s in 100-line requests
	peerLatestP50 = 200 * time.Microsecond
	peerLatestP99 = 600 * time.Microsecond
)

// Targets.
const (
	targetPipelineRatio = 0.8 // end to end 1/msg against JetStream publish and consume+ack at once
	targetBlocksRatio   = 1.5 // end to end 100/msg against raw Badger, one entry per reading
	targetLatestIdle    = time.Millisecond
	targetLatestLoad    = 5 * time.Millisecond
	targetRange         = 5 * time.Millisecond
	targetDiskBytes     = 40.0
	targetTelemetry     = 0.9
)

// machine describes where the run happened.
type machine struct {
	CPUs      int
	CPUModel  string
	Memory    string
	GoVersion string
	Kernel    string
	LoadStart string // /proc/loadavg when the run started
}

// loadavg is the 1, 5 and 15 minute load averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}

func describeMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), CPUModel: "unknown", Memory: "unknown", LoadStart: loadavg()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
				m.Memory = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	return m
}

// section is one table of the report.
type section struct {
	title  string
	header []string
	rows   [][]string
	notes  []string
}

// report is the rendered result of a run.
type report struct {
	head     []string
	sections []section
}

// text renders the report with aligned columns.
func (r report) text() string {
	var sb strings.Builder
	for _, h := range r.head {
		sb.WriteString(h + "\n")
	}
	for _, s := range r.sections {
		sb.WriteString("\n" + s.title + "\n")
		widths := make([]int, len(s.header))
		for _, row := range append([][]string{s.header}, s.rows...) {
			for i, c := range row {
				widths[i] = max(widths[i], len(c))
			}
		}
		for j, row := range append([][]string{s.header}, s.rows...) {
			for i, c := range row {
				if i > 0 {
					sb.WriteString("  ")
				}
				sb.WriteString(c + strings.Repeat(" ", widths[i]-len(c)))
			}
			sb.WriteString("\n")
			if j == 0 {
				for i, w := range widths {
					if i > 0 {
						sb.WriteString("  ")
					}
					sb.WriteString(strings.Repeat("-", w))
				}
				sb.WriteString("\n")
			}
		}
		for _, n := range s.notes {
			sb.WriteString("  " + n + "\n")
		}
	}
	return sb.String()
}

// markdown renders the report as markdown tables.
func (r report) markdown() string {
	var sb strings.Builder
	for _, h := range r.head {
		sb.WriteString(h + "  \n")
	}
	for _, s := range r.sections {
		sb.WriteString("\n#### " + s.title + "\n\n")
		sb.WriteString("| " + strings.Join(s.header, " | ") + " |\n")
		sb.WriteString("|" + strings.Repeat("---|", len(s.header)) + "\n")
		for _, row := range s.rows {
			sb.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
		if len(s.notes) > 0 {
			sb.WriteString("\n")
			for _, n := range s.notes {
				sb.WriteString(n + "\n")
			}
		}
	}
	return sb.String()
}

// num formats n with thousands separators.
func num(n float64) string {
	s := strconv.FormatInt(int64(n+0.5), 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// ms formats d in milliseconds.
func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) + " ms"
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return strconv.FormatFloat(a/b, 'f', 2, 64)
}

func mib(b int64) string { return strconv.FormatFloat(float64(b)/(1<<20), 'f', 0, 64) + " MiB" }

func met(ok bool) string {
	if ok {
		return "yes"
	}
	return "NO"
}
