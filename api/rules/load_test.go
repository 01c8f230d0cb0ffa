package rules

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestLoadNamesFileLineAndRule(t *testing.T) {
	cases := map[string]struct{ body, want string }{
		"syntax error": {`groups:
  - name: g
    rules:
      - alert: Hot
        expr: temp > > 30
`, `5:15: group "g", rule 1, "Hot": could not parse expression`},
		"unknown function": {`groups:
  - name: g
    rules:
      - alert: Hot
        expr: hotness(temp) > 30
`, `group "g", rule 1, "Hot": could not parse expression: 1:1: parse error: unknown function with name "hotness"`},
		"template error": {`groups:
  - name: g
    rules:
      - alert: Hot
        expr: temp > 30
        annotations:
          summary: "{{ $labels.device "
`, `group "g", rule 1, "Hot": annotation "summary": template: __alert_Hot:1: unclosed action`},
		"bad record name": {`groups:
  - name: g
    rules:
      - record: fleet:temp:avg
        expr: avg(temp)
`, `group "g", rule 1, "fleet:temp:avg": a recording rule's result is stored as a value of that name`},
		"unknown field": {`groups:
  - name: g
    rules:
      - alert: Hot
        expr: temp > 30
        four: 5m
`, `line 6: field four not found`},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			p := writeFile(t, "bad.yml", c.body)
			_, err := Load([]string{p}, 0)
			require.Error(t, err)
			assert.Contains(t, err.Error(), p)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestLoadGlobMatchesNothing(t *testing.T) {
	_, err := Load([]string{filepath.Join(t.TempDir(), "*.yml")}, 0)
	require.ErrorContains(t, err, "no file matches")
}

// rulesFile is a valid file of n alerting rules in one group.
func rulesFile(n int) string {
	var b strings.Builder
	b.WriteString("groups:\n  - name: many\n    rules:\n")
	for i := range n {
		fmt.Fprintf(&b, "      - alert: A%d\n        expr: temp > %d\n", i, i)
	}
	return b.String()
}

func TestLoadBounds(t *testing.T) {
	t.Run("file size", func(t *testing.T) {
		body := rulesFile(1)
		pad := "#" + strings.Repeat("x", MaxFileBytes-len(body)-2) + "\n"
		ok := writeFile(t, "ok.yml", body+pad)
		gs, err := Load([]string{ok}, 0)
		require.NoError(t, err, "a file of exactly MaxFileBytes")
		require.Len(t, gs, 1)

		big := writeFile(t, "big.yml", body+pad+"\n")
		_, err = Load([]string{big}, 0)
		require.ErrorContains(t, err, fmt.Sprintf("larger than %d bytes", MaxFileBytes))

		tenMB := writeFile(t, "ten.yml", body+strings.Repeat("#"+strings.Repeat("y", 1000)+"\n", 10_000))
		_, err = Load([]string{tenMB}, 0)
		require.ErrorContains(t, err, "larger than")
	})
	t.Run("rule count", func(t *testing.T) {
		gs, err := Load([]string{writeFile(t, "max.yml", rulesFile(MaxRules))}, 0)
		require.NoError(t, err)
		require.Len(t, gs[0].Rules, MaxRules)
		_, err = Load([]string{writeFile(t, "over.yml", rulesFile(MaxRules+1))}, 0)
		require.ErrorContains(t, err, fmt.Sprintf("more than %d", MaxRules))
		_, err = Load([]string{writeFile(t, "tenk.yml", rulesFile(10_000))}, 0)
		require.ErrorContains(t, err, fmt.Sprintf("more than %d", MaxRules))
	})
	t.Run("rules over several files", func(t *testing.T) {
		dir := t.TempDir()
		half := strings.Replace(rulesFile(MaxRules/2+1), "name: many", "name: a", 1)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "a.yml"), []byte(half), 0o600))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "b.yml"), []byte(strings.Replace(half, "name: a", "name: b", 1)), 0o600))
		_, err := Load([]string{filepath.Join(dir, "*.yml")}, 0)
		require.ErrorContains(t, err, fmt.Sprintf("more than %d rules", MaxRules))
	})
}
