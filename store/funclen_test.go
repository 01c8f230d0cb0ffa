package store

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is how long a function of package store may be without
// saying why in its doc comment, on a line starting "Long:".
const maxFuncLines = 50

// TestFunctionLength keeps the functions of package store and of the
// sub-packages that hold code moved out of it short: a function whose
// body is longer than maxFuncLines lines must say why in a doc comment
// line starting with "Long:".
func TestFunctionLength(t *testing.T) {
	t.Parallel()
	for _, dir := range []string{".", "devindex", "aggregate", "replay", "countfile", "blocked", "rollup", "badgeropts", "resolve", "compactplan", "dirlock", "spans", "settlequeue", "storemetrics", "versions", "giveway", "watch", "repair"} {
		long, err := longFunctions(dir, maxFuncLines)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range long {
			t.Errorf("%s is %d lines long (limit %d) and its doc comment has no \"Long:\" line saying why", f.name, f.lines, maxFuncLines)
		}
	}
}

func TestFunctionLengthCheckFindsLongFunctions(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	body := strings.Repeat("\tx++\n", maxFuncLines-1)
	src := "package p\n\nfunc short() {\n\tx := 0\n" + body + "}\n\n" +
		"func tooLong() {\n\tx := 0\n" + body + "\tx++\n}\n\n" +
		"// explained is long.\n//\n// Long: one state machine reads best in one place.\nfunc explained() {\n\tx := 0\n" + body + "\tx++\n}\n\n" +
		"// type T struct{}\ntype T struct{}\n\n// M is a long method.\nfunc (T) M() {\n\tx := 0\n" + body + "\tx++\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "p.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p_test.go"), []byte("package p\n\nfunc testLong() {\n"+body+body+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	long, err := longFunctions(dir, maxFuncLines)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range long {
		names = append(names, f.name)
	}
	if got, want := strings.Join(names, ","), "tooLong,T.M"; got != want {
		t.Fatalf("long functions found: %q, want %q (a body of exactly %d lines passes; a justified one and test files are skipped)", got, want, maxFuncLines)
	}
}

// longFunction is a function past the limit.
type longFunction struct {
	name  string
	lines int
}

// longFunctions lists the functions in the non-test Go files of dir
// whose body (the lines between the braces) is longer than limit lines
// and whose doc comment has no line starting with "Long:".
func longFunctions(dir string, limit int) ([]longFunction, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	var out []longFunction
	for _, path := range files {
		if strings.HasSuffix(path, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			lines := fset.Position(fn.Body.Rbrace).Line - fset.Position(fn.Body.Lbrace).Line - 1
			if lines > limit && !justified(fn.Doc) {
				out = append(out, longFunction{name: funcName(fn), lines: lines})
			}
		}
	}
	return out, nil
}

// justified reports whether doc has a line starting with "Long:".
func justified(doc *ast.CommentGroup) bool {
	if doc == nil {
		return false
	}
	for _, line := range strings.Split(doc.Text(), "\n") {
		if strings.HasPrefix(line, "Long:") {
			return true
		}
	}
	return false
}

// funcName is Recv.Name for a method, Name for a function.
func funcName(fn *ast.FuncDecl) string {
	if fn.Recv == nil || len(fn.Recv.List) == 0 {
		return fn.Name.Name
	}
	typ := fn.Recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if id, ok := typ.(*ast.Ident); ok {
		return id.Name + "." + fn.Name.Name
	}
	return fn.Name.Name
}
