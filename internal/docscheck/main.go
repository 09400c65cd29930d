// Command docscheck checks README.md, BENCHMARKS.md, RELEASING.md and
// docs/**/*.md (or the files named), and prints each problem as
// file:line: rule: what is wrong; it exits 1 if there is any. make check
// runs it at the repository's root:
//
//	go run ./internal/docscheck [-root DIR] [FILE.md ...]
//
// Rule go: every ```go block compiles against the current API: go/types
// checks it against the export data that go list -export builds in the
// workspace (nothing is downloaded). Errors go/types calls soft (declared
// and not used, imported and not used) are ignored.
//   - A block whose first line of code starts with "package " is a whole
//     file, and compiles on its own, as is.
//   - A block after the line <!-- docs: top-level --> holds top-level
//     declarations; any other is a fragment: the statements of a function
//     that returns an error.
//   - Both see the prelude (gocheck.go): ctx context.Context, db *sql.DB,
//     tx *sql.Tx, pool *pgxpool.Pool, key txlock.Key, keys []txlock.Key,
//     fn func(context.Context, *sql.Tx) error, logger *slog.Logger,
//     err error, and the strings sku, url and hostname, less those that a
//     top-level block declares; and they import the packages of pkgs
//     (txlock, pgxlock, sqlxlock, txlockprom, pgx, pgxpool, sqlx, sql,
//     context, time, errors, fmt, log, slog, …) that they name. An
//     ellipsis … stands for elided code (it compiles as panic(0)).
//   - A block after the line <!-- docs: no-compile (reason) --> is not
//     compiled; the reason is required.
//
// Blocks in other languages are not compiled.
//
// Rule link: every relative link ([text](target), [ref]: target, an HTML
// href or src) names a file or directory that exists, and its #anchor,
// into a .md file, a heading there by GitHub's rule (lower case,
// punctuation but - and _ removed, spaces to -, -1, -2, … after
// duplicates) or an HTML id or name. Links with a scheme (https:,
// mailto:) are not followed.
//
// Rule figure: a section (a heading and what follows up to the next
// heading of the same or a higher level) whose prose or tables give a
// measured figure (a number then ms, µs, ns, s, ×, x, acq/s or %: 12 ms,
// 0.95×, 3%; code spans and blocks are not scanned, so a setting such as
// `5s` is no figure) contains a command that produced it: a code span or
// a line of a code block that starts with go run, go test, make, scripts/
// or bash (after an optional $ and VAR=value words). The opening text of
// an enclosing section (up to its first subheading), or of the file
// (before its first heading), counts too. A section is reported once.
package main

import (
	"cmp"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	root := flag.String("root", ".", "the repository's root, which files are named from and go list runs in")
	flag.Parse()
	files := flag.Args()
	if len(files) == 0 {
		files = []string{"README.md", "BENCHMARKS.md", "RELEASING.md"}
		_ = filepath.WalkDir(filepath.Join(*root, "docs"), func(p string, e fs.DirEntry, err error) error {
			if rel, _ := filepath.Rel(*root, p); err == nil && strings.HasSuffix(p, ".md") {
				files = append(files, filepath.ToSlash(rel))
			}
			return err
		})
	}
	problems, err := check(*root, *root, files)
	if err != nil {
		fmt.Fprintln(os.Stderr, "docscheck:", err)
		os.Exit(2)
	}
	n := map[string]int{}
	for _, p := range problems {
		fmt.Println(p)
		n[p.rule]++
	}
	fmt.Printf("docscheck: %d files, %d problems (go %d, link %d, figure %d)\n", len(files), len(problems), n["go"], n["link"], n["figure"])
	if len(problems) > 0 {
		os.Exit(1)
	}
}

type problem struct {
	file string
	line int
	rule string
	msg  string
}

func (p problem) String() string { return fmt.Sprintf("%s:%d: %s: %s", p.file, p.line, p.rule, p.msg) }

type checker struct {
	root, goDir string
	docs        map[string]*doc // by slash path from root
	problems    []problem
}

// check returns the problems of the files (slash paths from root); go list
// runs in goDir. An error is one that stops the check.
func check(root, goDir string, files []string) ([]problem, error) {
	c := &checker{root: root, goDir: goDir, docs: map[string]*doc{}}
	var ds []*doc
	var names []string
	for _, f := range files {
		d, err := c.doc(filepath.ToSlash(filepath.Clean(f)))
		if err != nil {
			return nil, err
		}
		ds, names = append(ds, d), append(names, d.name)
		text, spans := d.prose()
		c.links(d, text)
		c.figures(d, text, spans)
	}
	if err := c.compileAll(ds); err != nil {
		return nil, err
	}
	slices.SortStableFunc(c.problems, func(a, b problem) int {
		return cmp.Or(slices.Index(names, a.file)-slices.Index(names, b.file), a.line-b.line)
	})
	return c.problems, nil
}

func (c *checker) doc(name string) (*doc, error) {
	if d := c.docs[name]; d != nil {
		return d, nil
	}
	src, err := os.ReadFile(filepath.Join(c.root, filepath.FromSlash(name)))
	if err != nil {
		return nil, err
	}
	c.docs[name] = parse(name, src)
	return c.docs[name], nil
}

func (c *checker) report(file string, line int, rule, format string, args ...any) {
	msg := strings.NewReplacer("\n\t", " ", "\n", " ").Replace(fmt.Sprintf(format, args...))
	c.problems = append(c.problems, problem{file, line, rule, msg})
}
