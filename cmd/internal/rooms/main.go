// Command rooms follows a path through the code as a reader would and
// counts how often it goes back to a file it has already read.
//
// From an entry function it walks the static call graph depth first,
// in the order the calls appear in each body: every function the entry
// reaches through direct calls (functions and methods of concrete
// types; calls through interfaces and function values are not
// followed) inside the packages of -scope. Each function lands the
// reader in its file, a room. The rooms in the order the functions are
// first reached, a repeat of the same room merged, are the path; a
// return is an entry into a room already on it. Fewer returns mean the
// path reads more front to back: what one job needs sits together.
//
//	go run ./cmd/internal/rooms -entry '(*github.com/telemetryd/telemetryd/store.Store).Commit' -scope github.com/telemetryd/telemetryd/store
//
// It type-checks the packages of -scope from their source, with the
// export data `go list -export` gives for everything they import, so it
// needs only the go command.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	entry := flag.String("entry", "", "full name of the function to start from, as go/types writes it, e.g. (*example.com/m/store.Store).Commit")
	scope := flag.String("scope", "", "comma-separated import path prefixes whose functions the walk follows")
	verbose := flag.Bool("v", false, "print every function on the path with its room")
	flag.Parse()
	if *entry == "" || *scope == "" {
		fmt.Fprintln(os.Stderr, "rooms: -entry and -scope are required")
		os.Exit(2)
	}
	prefixes := strings.Split(*scope, ",")
	g, err := load(prefixes)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rooms:", err)
		os.Exit(1)
	}
	if _, ok := g.funcs[*entry]; !ok {
		fmt.Fprintf(os.Stderr, "rooms: -entry %s is not a function of -scope\n", *entry)
		os.Exit(1)
	}
	w := walk{g: g, seen: map[string]bool{}}
	w.visit(*entry)
	report(os.Stdout, w, *verbose)
}

// pkg is one package as `go list -json` describes it.
type pkg struct {
	ImportPath string
	Dir        string
	Export     string
	GoFiles    []string
	Standard   bool
}

// fn is a function declaration of a package in scope.
type fn struct {
	decl *ast.FuncDecl
	file string // relative to the module root
	info *types.Info
}

// graph holds the declarations of every function in scope, by the full
// name go/types gives them.
type graph struct {
	fset  *token.FileSet
	funcs map[string]fn
}

// load type-checks every package whose import path has one of the
// prefixes, importing the rest from export data.
func load(prefixes []string) (*graph, error) {
	pkgs, err := goList(prefixes)
	if err != nil {
		return nil, err
	}
	exports := map[string]string{}
	for _, p := range pkgs {
		exports[p.ImportPath] = p.Export
	}
	root, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		f, ok := exports[path]
		if !ok || f == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(f)
	})
	g := &graph{fset: fset, funcs: map[string]fn{}}
	for _, p := range pkgs {
		if !inScope(p.ImportPath, prefixes) {
			continue
		}
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				return nil, err
			}
			files = append(files, f)
		}
		info := &types.Info{Defs: map[*ast.Ident]types.Object{}, Uses: map[*ast.Ident]types.Object{}, Selections: map[*ast.SelectorExpr]*types.Selection{}}
		conf := types.Config{Importer: imp}
		if _, err := conf.Check(p.ImportPath, fset, files, info); err != nil {
			return nil, fmt.Errorf("type-check %s: %w", p.ImportPath, err)
		}
		for _, f := range files {
			rel, err := filepath.Rel(root, fset.File(f.Pos()).Name())
			if err != nil {
				return nil, err
			}
			for _, d := range f.Decls {
				if fd, ok := d.(*ast.FuncDecl); ok && fd.Body != nil {
					if obj, ok := info.Defs[fd.Name].(*types.Func); ok {
						g.funcs[obj.FullName()] = fn{decl: fd, file: rel, info: info}
					}
				}
			}
		}
	}
	return g, nil
}

// goList lists the packages of the prefixes with their dependencies,
// each with its export data.
func goList(prefixes []string) ([]pkg, error) {
	var patterns []string
	for _, p := range prefixes {
		patterns = append(patterns, p, p+"/...")
	}
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json=ImportPath,Dir,Export,GoFiles,Standard"}, patterns...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr // "matched no packages" of a prefix without sub-packages
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %w: %s", err, stderr.Bytes())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		pkgs = append(pkgs, p)
	}
	return pkgs, nil
}

func inScope(path string, prefixes []string) bool {
	for _, p := range prefixes {
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// walk is the depth-first walk: the functions in the order first
// reached, each with its room.
type walk struct {
	g     *graph
	seen  map[string]bool
	order []string
}

func (w *walk) visit(name string) {
	f, ok := w.g.funcs[name]
	if !ok || w.seen[name] {
		return
	}
	w.seen[name] = true
	w.order = append(w.order, name)
	ast.Inspect(f.decl.Body, func(n ast.Node) bool {
		if call, ok := n.(*ast.CallExpr); ok {
			if callee := calleeOf(f.info, call); callee != nil {
				w.visit(callee.FullName())
			}
		}
		return true
	})
}

// calleeOf is the function a call statically names, or nil (a call
// through an interface or a function value, a conversion, a builtin).
func calleeOf(info *types.Info, call *ast.CallExpr) *types.Func {
	var id *ast.Ident
	switch e := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		id = e
	case *ast.SelectorExpr:
		if sel, ok := info.Selections[e]; ok && types.IsInterface(sel.Recv()) {
			return nil
		}
		id = e.Sel
	case *ast.IndexExpr: // a generic function instantiated explicitly
		if s, ok := e.X.(*ast.Ident); ok {
			id = s
		}
	}
	if id == nil {
		return nil
	}
	f, _ := info.Uses[id].(*types.Func)
	if f != nil {
		f = f.Origin()
	}
	return f
}

// report prints the path's rooms, how often each was entered, and the
// returns.
func report(w io.Writer, wk walk, verbose bool) {
	var path []string
	entries := map[string]int{}
	for _, name := range wk.order {
		room := wk.g.funcs[name].file
		if verbose {
			fmt.Fprintf(w, "%-40s %s\n", room, name)
		}
		if len(path) > 0 && path[len(path)-1] == room {
			continue
		}
		path = append(path, room)
		entries[room]++
	}
	rooms := make([]string, 0, len(entries))
	for r := range entries {
		rooms = append(rooms, r)
	}
	sort.Slice(rooms, func(i, j int) bool {
		if entries[rooms[i]] != entries[rooms[j]] {
			return entries[rooms[i]] > entries[rooms[j]]
		}
		return rooms[i] < rooms[j]
	})
	for _, r := range rooms {
		fmt.Fprintf(w, "%3d  %s\n", entries[r], r)
	}
	fmt.Fprintf(w, "functions %d, rooms %d, entries %d, returns %d\n", len(wk.order), len(rooms), len(path), len(path)-len(rooms))
}
