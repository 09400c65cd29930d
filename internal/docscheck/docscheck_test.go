package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// run checks the markdown files (name, content, …), written into a
// temporary directory, with go list in the repository's root, and returns
// the problems as lines.
func run(t *testing.T, files ...string) []string {
	t.Helper()
	dir := t.TempDir()
	var names []string
	for i := 0; i < len(files); i += 2 {
		p := filepath.Join(dir, files[i])
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(files[i+1]), 0o644); err != nil {
			t.Fatal(err)
		}
		if strings.HasSuffix(files[i], ".md") {
			names = append(names, files[i])
		}
	}
	problems, err := check(dir, "../..", names)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range problems {
		out = append(out, p.String())
	}
	return out
}

// expect fails unless got has exactly one line per want, each containing it.
func expect(t *testing.T, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.Contains(got[i], want[i]) {
			t.Errorf("problem %d is\n\t%s\nwant it to contain\n\t%s", i, got[i], want[i])
		}
	}
}

const fence = "```"

func TestGoGood(t *testing.T) {
	expect(t, run(t, "a.md", `# Go
A fragment, with the prelude, an ellipsis and an unused variable:

`+fence+`go
unused := 1
n, err := txlock.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (int64, error) { … })
…
if err != nil {
	return fmt.Errorf("n=%d: %w", n, err) // not a … here
}
time.Sleep(time.Second)
`+fence+`

A whole file:

`+fence+`go
// Command hello says hello.
package main

import "fmt"

func main() { fmt.Println("hello") }
`+fence+`

<!-- docs: top-level -->

`+fence+`go
type job struct{ name string }

func fn(ctx context.Context, tx *sql.Tx) error { return txlock.LockTx(ctx, tx, key) }
`+fence+`

<!-- docs: no-compile (pseudo-code) -->
`+fence+`go
this does not compile
`+fence+`

`+fence+`sh
go run this is not go
`+fence+`
`))
}

func TestGoBad(t *testing.T) {
	expect(t, run(t, "a.md", `# Go

`+fence+`go
err := txlock.WithLock(ctx, db, fn)
x := undefinedThing
`+fence+`

`+fence+`go
package main

func main() { return 1 }
`+fence+`

<!-- docs: top-level -->
`+fence+`go
ctx := 1
`+fence+`

<!-- docs: no-compile -->
`+fence+`go
`+fence+`

<!-- docs: compile-me -->
`+fence+`go
`+fence+`

<!-- docs: top-level -->
`+fence+`sql
SELECT 1
`+fence+`

1. In a list:

   `+fence+`go
   package main

   import "example.com/nowhere"
   `+fence+`
`),
		"a.md:4: go: not enough arguments in call to txlock.WithLock",
		"a.md:5: go: undefined: undefinedThing",
		"a.md:11: go: too many return values",
		"a.md:16: go: expected declaration, found ctx (as a top-level block)",
		"a.md:20: go: <!-- docs: no-compile --> needs a reason",
		"a.md:24: go: unknown directive <!-- docs: compile-me -->",
		`a.md:28: go: a <!-- docs: top-level --> line before a "sql" block`,
		`a.md:37: go: could not import example.com/nowhere (no required module provides package example.com/nowhere; to add it: go get`)
}

func TestLinksGood(t *testing.T) {
	expect(t, run(t,
		"README.md", `# Title

See [the guide](docs/guide.md), [its setup](docs/guide.md#setup-step-1-the-pgx_pool),
[the second Setup](docs/guide.md#setup-1), [the docs](docs/), [here](#title-two-v20),
[a site](https://example.com/x#y), ![chart](docs/chart.svg "Chart"), <a href="#anchor">x</a>
and [a reference][ref]. In code: `+"`[no](nowhere.md)`"+`.

## Title: *two* (v2.0)

<a id="anchor"></a>

[ref]: docs/guide.md#setup
`,
		"docs/guide.md", "# Guide\n\n## Setup: step 1, the `pgx_pool`\n\n## Setup\n\n## Setup\n\n```sh\n# not a heading\n```\n\nBack to [the README](../README.md#title).\n",
		"docs/chart.svg", "<svg/>"))
}

func TestLinksBad(t *testing.T) {
	expect(t, run(t,
		"README.md", "# Title\n\n[gone](docs/gone.md) and [no anchor](docs/guide.md#setup-2)\n\n[here](#Title) [ref]\n\n[ref]: #nothing\n",
		"docs/guide.md", "# Guide\n\n## Setup\n\n## Setup\n\n```sh\n## Setup\n```\n"),
		`README.md:3: link: link "docs/gone.md": docs/gone.md does not exist`,
		`README.md:3: link: link "docs/guide.md#setup-2": docs/guide.md has no heading or id with the anchor #setup-2`,
		`README.md:5: link: link "#Title": README.md has no heading or id with the anchor #Title`,
		`README.md:7: link: link "#nothing"`)
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Quick start":                        "quick-start",
		"pgx native: pgxlock":                "pgx-native-pgxlock",
		"Issue #20: waiting, first round":    "issue-20-waiting-first-round",
		"`go test -bench` (same machine)":    "go-test--bench-same-machine",
		"[Links](x.md) and ünïcode_names":    "links-and-ünïcode_names",
		"PostgreSQL 13–18, 1.18 — and more!": "postgresql-1318-118--and-more",
	} {
		if got := slug(h); got != want {
			t.Errorf("slug(%q) = %q, want %q", h, got, want)
		}
	}
}

func TestFiguresGood(t *testing.T) {
	expect(t, run(t, "a.md", `# Results

Measured with `+"`go run ./cmd/txlock-bench`"+`.

## Uncontended

It takes 1.2 ms, 0.95× of a plain transaction, 1,200 acq/s.

# Settings

PostgreSQL 13–18 and PgBouncer 1.18, a pool of 20, 3 sessions, 0x1F, the
default `+"`5s`"+` as a code span, in 2024.

# Tests

## Race

`+"`MATRIX_JOBS=0 make\nmatrix`"+` took 146 s.

## Bench

`+fence+`sh
$ scripts/bench.sh
`+fence+`

3x faster, ±30%.

### Deeper

12 µs here: the command is in the section above, which includes this one.
`))
}

func TestFiguresBad(t *testing.T) {
	expect(t, run(t, "lead.md", "A 5 s lead, and `go vet` is no command that measures.\n\n# Title\n\n## One\n"),
		`lead.md:1: figure: "5 s" in section before the first heading, with no command that measured it`)
	expect(t, run(t, "a.md", `# Title

## One

`+"`make test`"+` runs it.

## Two

It took 30 s, and 2x, and 50%.

### Three

12 ms and `+"`go vet`"+` (not a command that measures).
`),
		`a.md:9: figure: "30 s" (and 2 more) in section "## Two", with no command that measured it`,
		`a.md:13: figure: "12 ms" in section "### Three", with no command that measured it`)
}
