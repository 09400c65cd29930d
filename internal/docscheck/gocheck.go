package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/scanner"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
)

// pkgs are the packages that top-level blocks and fragments import, those
// they name.
var pkgs = map[string]string{
	"context": "context", "errors": "errors", "fmt": "fmt", "http": "net/http", "log": "log", "os": "os",
	"slog": "log/slog", "sql": "database/sql", "strings": "strings", "sync": "sync", "time": "time",
	"txlock": "github.com/txlock/txlock", "pgxlock": "github.com/txlock/txlock/pgxlock",
	"sqlxlock": "github.com/txlock/txlock/sqlxlock", "interop": "github.com/txlock/txlock/interop",
	"txlockprom": "github.com/txlock/txlock/txlockprom", "txlockotel": "github.com/txlock/txlock/txlockotel",
	"pgx": "github.com/jackc/pgx/v5", "pgconn": "github.com/jackc/pgx/v5/pgconn",
	"pgxpool": "github.com/jackc/pgx/v5/pgxpool", "sqlx": "github.com/jmoiron/sqlx",
	"prometheus": "github.com/prometheus/client_golang/prometheus",
}

// prelude is what top-level blocks and fragments have in scope.
var prelude = [][2]string{
	{"ctx", "context.Context"}, {"db", "*sql.DB"}, {"tx", "*sql.Tx"}, {"pool", "*pgxpool.Pool"},
	{"key", "txlock.Key"}, {"keys", "[]txlock.Key"}, {"fn", "func(context.Context, *sql.Tx) error"},
	{"logger", "*slog.Logger"}, {"err", "error"}, {"sku", "string"}, {"url", "string"}, {"hostname", "string"},
}

var fileRE = regexp.MustCompile(`^(?:[ \t]*(?://.*)?\n)*[ \t]*package `)

// unit is a go block made into the files of a package.
type unit struct {
	d     *doc
	b     block
	name  string // the block's file
	shift int    // the block's line n is its file's line n+shift
	files []*ast.File
}

func (c *checker) compileAll(ds []*doc) error {
	fset := token.NewFileSet()
	var units []*unit
	args := []string{"list", "-e", "-export", "-deps", "-json=ImportPath,Export,Error"}
	for _, d := range ds {
		for _, b := range d.blocks {
			if u := c.unit(fset, d, b); u != nil {
				units = append(units, u)
				for _, f := range u.files {
					for _, s := range f.Imports {
						p, _ := strconv.Unquote(s.Path.Value)
						args = append(args, p)
					}
				}
			}
		}
	}
	if len(units) == 0 {
		return nil
	}
	cmd := exec.Command("go", args...)
	cmd.Dir, cmd.Stderr = c.goDir, os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("go list -export in %s: %v", c.goDir, err)
	}
	type pkg struct {
		ImportPath, Export string
		Error              *struct{ Err string }
	}
	exports := map[string]pkg{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			return fmt.Errorf("go list -export: %v", err)
		}
		exports[p.ImportPath] = p
	}
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if p := exports[path]; p.Error != nil {
			return nil, errors.New(p.Error.Err)
		} else if p.Export == "" {
			return nil, fmt.Errorf("go list -export in %s built no export data for it", c.goDir)
		}
		return os.Open(exports[path].Export)
	})
	for _, u := range units {
		conf := types.Config{Importer: imp, Error: func(err error) {
			if te, ok := err.(types.Error); ok && !te.Soft {
				c.report(u.d.name, u.line(te.Fset.Position(te.Pos)), "go", "%s", te.Msg)
			}
		}}
		conf.Check("docs", fset, u.files, nil)
	}
	return nil
}

// line returns the line of the markdown file that pos is on: the fence's
// for positions outside the block's own text.
func (u *unit) line(pos token.Position) int {
	if n := pos.Line - u.shift; pos.Filename == u.name && n >= 1 && n <= strings.Count(u.b.text, "\n")+1 {
		return u.b.fence + n
	}
	return u.b.fence
}

// unit parses the block b of d into the files of a package, or returns nil
// if it is not to be compiled or cannot be parsed, reporting why.
func (c *checker) unit(fset *token.FileSet, d *doc, b block) *unit {
	dir, reason, _ := strings.Cut(b.directive, " ")
	bad := ""
	switch {
	case b.lang != "go" && b.directive != "":
		bad = fmt.Sprintf("a <!-- docs: %s --> line before a %q block, not a go block", b.directive, b.lang)
	case b.lang != "go", dir == "no-compile" && len(reason) > 2 && reason[0] == '(' && reason[len(reason)-1] == ')':
		return nil
	case dir == "no-compile":
		bad = "<!-- docs: no-compile --> needs a reason: <!-- docs: no-compile (why) -->"
	case b.directive != "" && b.directive != "top-level":
		bad = fmt.Sprintf("unknown directive <!-- docs: %s -->: top-level or no-compile (reason)", b.directive)
	}
	if bad != "" {
		c.report(d.name, b.fence, "go", "%s", bad)
		return nil
	}
	u := &unit{d: d, b: b, name: fmt.Sprintf("%s:%d.go", d.name, b.fence)}
	text := strings.ReplaceAll(b.text, "…", "panic(0)")
	kind, header, footer := "top-level block", "package docs\n", ""
	if fileRE.MatchString(text) {
		kind, header = "whole file", ""
	} else if b.directive != "top-level" {
		kind, header, footer = "fragment", "package docs; func _() error {\n", "\nreturn nil }"
	}
	u.shift = strings.Count(header, "\n")
	f, err := parser.ParseFile(fset, u.name, header+text+footer, parser.AllErrors)
	if err != nil {
		list := scanner.ErrorList{{Pos: token.Position{Filename: u.name}, Msg: err.Error()}}
		errors.As(err, &list)
		for i := 0; i < len(list) && i < 3; i++ {
			c.report(d.name, u.line(list[i].Pos), "go", "%s (as a %s)", list[i].Msg, kind)
		}
		return nil
	}
	u.files = []*ast.File{f}
	if kind == "whole file" {
		return u
	}
	// The block's own top-level names replace the prelude's and the
	// packages'.
	vars := "package docs\n"
	for _, v := range prelude {
		if f.Scope.Lookup(v[0]) == nil {
			vars += "var " + v[0] + " " + v[1] + "\n"
		}
	}
	pf, err := parser.ParseFile(fset, "prelude.go", vars, 0)
	if err != nil {
		panic(err)
	}
	u.files = append(u.files, pf)
	for _, f := range u.files {
		addImports(f, u.files[0].Scope)
	}
	return u
}

// addImports adds to f an import of each package of pkgs that it names
// and does not declare, nor own.
func addImports(f *ast.File, own *ast.Scope) {
	decl, seen := &ast.GenDecl{Tok: token.IMPORT}, map[string]bool{}
	for _, id := range f.Unresolved {
		if p := pkgs[id.Name]; p != "" && !seen[id.Name] && own.Lookup(id.Name) == nil {
			seen[id.Name] = true
			s := &ast.ImportSpec{Path: &ast.BasicLit{Kind: token.STRING, Value: strconv.Quote(p)}}
			decl.Specs, f.Imports = append(decl.Specs, s), append(f.Imports, s)
		}
	}
	if len(decl.Specs) > 0 {
		f.Decls = append([]ast.Decl{decl}, f.Decls...)
	}
}
