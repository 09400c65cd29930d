package main

import (
	"bytes"
	"context"
	"errors"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/txlock/txlock/examples/internal/exampledb"
	"github.com/txlock/txlock/examples/internal/exampletest"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestPgBouncer(t *testing.T) {
	exampletest.UseTestServers(t)
	const stock = 20
	total := len(skus) * stock

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := run(ctx, []string{"-workers", "4", "-stock", strconv.Itoa(stock), "-duration", "5s"}, &out)
	text := out.String()
	if errors.Is(err, exampledb.ErrNoServer) || errors.Is(err, errNoBouncer) {
		pgtest.Unavailable(t, "the example could not get a PostgreSQL and a PgBouncer (install the PostgreSQL server binaries and pgbouncer, or set TXLOCK_TEST_DATABASE_URL and TXLOCK_TEST_PGBOUNCER_URL): %v", err)
	}
	if err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, text)
	}
	t.Logf("output:\n%s", text)
	if strings.Contains(text, "No error: this PgBouncer keeps track of prepared statements") {
		pgtest.Unavailable(t, "the PgBouncer supports prepared statements, so cache_statement cannot fail; the example's first round needs PgBouncer 1.18 (before 1.21, or max_prepared_statements = 0)")
	}

	type row struct{ sold, left, oversold, failed int }
	rows := map[string]row{}
	_, table, ok := strings.Cut(text, "\nsummary\n")
	if !ok {
		t.Fatalf("no summary in the output")
	}
	re := regexp.MustCompile(`(?m)^(cache_statement|exec)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)$`)
	for _, m := range re.FindAllStringSubmatch(table, -1) {
		var r row
		r.sold, _ = strconv.Atoi(m[2])
		r.left, _ = strconv.Atoi(m[3])
		r.oversold, _ = strconv.Atoi(m[4])
		r.failed, _ = strconv.Atoi(m[5])
		rows[m[1]] = r
	}
	cs, ex := rows["cache_statement"], rows["exec"]
	if len(rows) != 2 {
		t.Fatalf("the summary lacks a round: %v\n%s", rows, table)
	}

	// Behind PgBouncer 1.18, cache_statement fails, for certain after the
	// restart; the real error is printed, with its SQLSTATE.
	if cs.failed == 0 {
		t.Errorf("cache_statement: no sale failed behind PgBouncer")
	}
	m := regexp.MustCompile(`before the restart (\d+) sold, (\d+) failed; after it (\d+) sold, (\d+) failed`).FindStringSubmatch(text)
	if m == nil || m[4] == "0" {
		t.Errorf("cache_statement: no sale failed after the restart (%q)", m)
	}
	if !regexp.MustCompile(`ERROR: prepared statement "stmtcache_[0-9a-f]+" (already exists \(SQLSTATE 42P05\)|does not exist \(SQLSTATE 26000\))`).MatchString(text) {
		t.Errorf("the output shows no error of a prepared statement with its SQLSTATE")
	}
	if !strings.Contains(text, "What it means:") {
		t.Errorf("the output does not explain the error")
	}

	// The lock holds in both rounds; in exec mode every sale succeeds.
	for name, r := range rows {
		if r.oversold != 0 || r.sold+r.left != total {
			t.Errorf("%s: sold %d, left %d, oversold %d of a stock of %d", name, r.sold, r.left, r.oversold, total)
		}
	}
	if ex.failed != 0 || ex.sold != total {
		t.Errorf("exec: %d sold of %d, %d failed; want all sold, none failed", ex.sold, total, ex.failed)
	}
}

// TestNoPgBouncer checks that without a PgBouncer the example says what to
// install and fails.
func TestNoPgBouncer(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	t.Setenv("PGBOUNCER_URL", "")
	t.Setenv("TXLOCK_TEST_PGBOUNCER", "/nonexistent/pgbouncer") // the harness looks for pgbouncer here first
	var out bytes.Buffer
	err := run(context.Background(), []string{"-workers", "2", "-stock", "1", "-duration", "1s"}, &out)
	if errors.Is(err, exampledb.ErrNoServer) {
		pgtest.Unavailable(t, "the example could not start a PostgreSQL (install the PostgreSQL server binaries): %v", err)
	}
	if !errors.Is(err, errNoBouncer) {
		t.Fatalf("run without pgbouncer: %v; want an error matching errNoBouncer\noutput:\n%s", err, out.String())
	}
	for _, want := range []string{"apt-get install pgbouncer", "PGBOUNCER_URL", "/nonexistent/pgbouncer"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not mention %q: %v", want, err)
		}
	}
	if !strings.Contains(out.String(), "stopped the throwaway servers") {
		t.Errorf("the PostgreSQL it started was not stopped:\n%s", out.String())
	}
}
