package main

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The package layout these tests keep: every format has one owner.
//
//   - buckets and its sub-packages import only the standard library:
//     every package depends on them, so they bring no other module in.
//   - api imports nothing from ingest or store: what api and ingest
//     both need (the messages of a line protocol write, the binary
//     payload form) lives under buckets, and api reaches NATS, the line
//     protocol mapper and the store only through interfaces it
//     declares. Its tests may wire in the mapper (ingest/lineproto), as
//     the service does, and run against a real store.
//   - The store's formats stay in store. Its block encoding, package
//     store/block, is imported by no package but store (tests
//     included); the device index's records and values and the block
//     keys are unexported in store, so the compiler keeps them there.
//     buckets holds no storage codec, and the node-to-node encoding
//     (api/cluster/nodewire) and the store do not import each other,
//     so either can change without the other.
//   - cmd/telemetryd only wires: its non-test code stays small.

const module = "github.com/telemetryd/telemetryd"

// maxTelemetrydLines bounds the non-test code of cmd/telemetryd; logic
// belongs in the library packages. It was 1,500 until the wiring of
// the partition streams, the storage-fault holds, table repair, the
// rules' evaluation came in (the start-up checks of ports and the data
// dir moved to cmd/internal/preflight); moving the configuration
// (config.go, about 400 lines) into a package of its own is the planned
// way back under it.
const maxTelemetrydLines = 1950

// goList runs go list with args in the module root and returns its
// output lines.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = filepath.Join("..", "..")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "go list %v: %s", args, stderr.String())
	return strings.Fields(string(out))
}

func TestAPIDoesNotImportIngest(t *testing.T) {
	inLane(t, lanes.general)
	under := func(p, dir string) bool { return p == module+"/"+dir || strings.HasPrefix(p, module+"/"+dir+"/") }
	deps := goList(t, "-deps", "./api/...")
	require.Contains(t, deps, module+"/buckets", "go list answered")
	for _, p := range deps {
		assert.False(t, under(p, "ingest") || under(p, "store"),
			"api depends on %s: api must import neither ingest nor store (put what both need under buckets, or declare an interface in api)", p)
	}
	testDeps := goList(t, "-deps", "-test", "./api/...")
	require.Contains(t, testDeps, module+"/ingest/lineproto", "go list answered")
	for _, p := range testDeps {
		assert.False(t, under(p, "ingest") && p != module+"/ingest/lineproto", "api's tests depend on %s", p)
	}
}

func TestBucketsImportsOnlyTheStandardLibrary(t *testing.T) {
	inLane(t, lanes.general)
	deps := goList(t, "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", "./buckets/...")
	require.Contains(t, deps, module+"/buckets", "go list answered")
	for _, p := range deps {
		assert.True(t, p == module+"/buckets" || strings.HasPrefix(p, module+"/buckets/"),
			"buckets depends on %s: buckets and its sub-packages import only the standard library", p)
	}
}

func TestStoreFormatsStayInStore(t *testing.T) {
	inLane(t, lanes.general)
	// Every package of the module with what it and its tests import.
	lines := goList(t, "-f", `{{.ImportPath}}|{{join .Imports ","}},{{join .TestImports ","}},{{join .XTestImports ","}}`, "./...")
	importers := map[string][]string{} // import path -> importing packages
	for _, l := range lines {
		pkg, imports, ok := strings.Cut(l, "|")
		require.True(t, ok, l)
		for _, imp := range strings.Split(imports, ",") {
			if imp != "" {
				importers[imp] = append(importers[imp], pkg)
			}
		}
	}
	require.NotEmpty(t, importers[module+"/store/block"], "go list answered")
	for _, p := range importers[module+"/store/block"] {
		assert.True(t, p == module+"/store" || strings.HasPrefix(p, module+"/store/"),
			"%s imports store/block: the block encoding is private to store and its packages", p)
	}
	for _, p := range importers[module+"/api/cluster/nodewire"] {
		assert.False(t, p == module+"/store" || strings.HasPrefix(p, module+"/store/"),
			"%s imports the node-to-node encoding: the store keeps its own", p)
	}
	for _, p := range importers[module+"/store"] {
		assert.NotEqual(t, module+"/api/cluster/nodewire", p, "the node-to-node encoding must not depend on the store")
	}

	// buckets declares no storage codec: no exported function that
	// encodes or decodes keys or values for a database.
	fset := token.NewFileSet()
	names, err := filepath.Glob(filepath.Join("..", "..", "buckets", "*.go"))
	require.NoError(t, err)
	require.NotEmpty(t, names)
	banned := map[string]bool{"AppendKey": true, "ParseKey": true, "DevicePrefix": true, "AppendValues": true, "DecodeValues": true}
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.SkipObjectResolution)
		require.NoError(t, err)
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && banned[fn.Name.Name] {
				t.Errorf("buckets declares %s (%s): storage and wire codecs belong to the package that owns the format", fn.Name.Name, fset.Position(fn.Pos()))
			}
		}
	}
}

// TestTelemetrydIsOnlyWiring counts the lines of the non-test Go files
// of this package.
func TestTelemetrydIsOnlyWiring(t *testing.T) {
	inLane(t, lanes.general)
	files, err := filepath.Glob("*.go")
	require.NoError(t, err)
	total, n := 0, 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		n++
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		total += bytes.Count(b, []byte{'\n'})
	}
	t.Logf("cmd/telemetryd: %d lines of non-test Go in %d files", total, n)
	assert.LessOrEqual(t, total, maxTelemetrydLines, "cmd/telemetryd only wires: move logic into a library package")
}
