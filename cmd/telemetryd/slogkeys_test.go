package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slogSynonyms are log keys that say what a key of the set says already:
// every package logs an error as err, a day table as day, a device ID as
// device, so that one query finds them all.
var slogSynonyms = map[string]string{
	"error":     "err",
	"e":         "err",
	"table":     "day",
	"day_table": "day",
	"dev":       "device",
	"device_id": "device",
	"deviceID":  "device",
}

// slogKeys returns every literal key of the log calls in the module's
// non-test Go files (file:line -> key): the key-value arguments of
// Debug/Info/Warn/Error(Context), Log and With, the keys of slog.String,
// slog.Any and the like, and the keys of []any{...} argument lists and
// of appends to them.
func slogKeys(t *testing.T, root string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	keys := map[string]string{}
	addKey := func(e ast.Expr) bool {
		lit, ok := e.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING {
			return false
		}
		k, err := strconv.Unquote(lit.Value)
		require.NoError(t, err)
		keys[fset.Position(lit.Pos()).String()] = k
		return true
	}
	isSlogAttr := func(e ast.Expr) bool {
		call, ok := e.(*ast.CallExpr)
		if !ok {
			return false
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		pkg, ok := sel.X.(*ast.Ident)
		return ok && pkg.Name == "slog"
	}
	pairs := func(args []ast.Expr) {
		for i := 0; i < len(args); {
			switch {
			case isSlogAttr(args[i]):
				i++ // one slog.Attr, checked on its own
			case addKey(args[i]):
				i += 2
			default:
				i++
			}
		}
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if at, ok := n.Type.(*ast.ArrayType); ok {
					if it, ok := at.Elt.(*ast.InterfaceType); ok && it.Methods.NumFields() == 0 {
						pairs(n.Elts)
					}
					if id, ok := at.Elt.(*ast.Ident); ok && id.Name == "any" {
						pairs(n.Elts)
					}
				}
			case *ast.CallExpr:
				if id, ok := n.Fun.(*ast.Ident); ok && id.Name == "append" && len(n.Args) > 1 {
					if x, ok := n.Args[0].(*ast.Ident); ok && (x.Name == "args" || x.Name == "attrs") {
						pairs(n.Args[1:])
					}
					return true
				}
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if isSlogAttr(n) && len(n.Args) > 0 {
					addKey(n.Args[0])
					return true
				}
				msgAt := map[string]int{"Debug": 0, "Info": 0, "Warn": 0, "Error": 0,
					"DebugContext": 1, "InfoContext": 1, "WarnContext": 1, "ErrorContext": 1, "Log": 2, "With": -1}
				at, ok := msgAt[sel.Sel.Name]
				if !ok || len(n.Args) <= at {
					return true
				}
				if at >= 0 {
					if lit, ok := n.Args[at].(*ast.BasicLit); !ok || lit.Kind != token.STRING {
						return true // not a log call (its message is a literal)
					}
				}
				pairs(n.Args[at+1:])
			}
			return true
		})
		return nil
	})
	require.NoError(t, err)
	return keys
}

// TestSlogKeysAreConsistent scans every package's log calls: no key is
// a synonym of one the others use (err, day, device).
func TestSlogKeysAreConsistent(t *testing.T) {
	inLane(t, lanes.general)
	keys := slogKeys(t, filepath.Join("..", ".."))
	require.Greater(t, len(keys), 100, "the scan finds the log calls")
	var seen []string
	for _, k := range keys {
		seen = append(seen, k)
	}
	assert.Subset(t, seen, []string{"err", "day", "device", "component"}, "the scan finds the keys in use")
	for pos, k := range keys {
		if want, ok := slogSynonyms[k]; ok {
			t.Errorf("%s: log key %q: use %q", pos, k, want)
		}
	}
}
