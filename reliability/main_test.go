// Package reliability_test proves txlock's guarantees the way the README's
// "Reliability" section reports them: a racy ledger workload (package
// internal/checker) runs under load and while faults are injected, and SQL
// checks count overlapping critical sections, lost updates and leaks.
package reliability_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
	"github.com/txlock/txlock/reliability/internal/checker"
)

func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) != "" {
		os.Exit(holderMain())
	}
	if os.Getenv(fleetEnv) != "" {
		os.Exit(fleetMain())
	}
	os.Exit(pgtest.Main(m))
}

// Environment variables of the long forms.
const (
	// loadEnv sets the acquisitions of TestLoad (default ciLoad).
	loadEnv = "TXLOCK_LOAD"
	// soakEnv enables TestSoak and sets its duration, e.g. "10m".
	soakEnv = "TXLOCK_SOAK"
)

const (
	workers = 64
	keys    = 8
	ciLoad  = 1000 // acquisitions of the CI form of TestLoad, per path
)

// loadTarget returns the acquisitions TestLoad makes.
func loadTarget(t *testing.T) int64 {
	s := os.Getenv(loadEnv)
	if s == "" {
		return ciLoad
	}
	n, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err, "%s must be a number of acquisitions", loadEnv)
	return n
}

// pool opens a pool on dsn sized for n concurrent callers. The caller
// closes it (checker.Leaks.RequireNone does).
func pool(t testing.TB, dsn string, n int) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	db.SetMaxOpenConns(n)
	db.SetMaxIdleConns(n)
	t.Cleanup(func() { db.Close() })
	return db
}

// client is a workload's pool: a *sql.DB that txlock locks on, or a
// *pgxpool.Pool that pgxlock does.
type client struct {
	db  *sql.DB
	pgx *pgxpool.Pool
}

// newClient opens a client of lib ("txlock" or "pgxlock") on dsn, sized for
// n concurrent callers. Its pool is closed when the test ends, or by finish.
func newClient(t testing.TB, lib, dsn string, n int) client {
	t.Helper()
	if lib != "pgxlock" {
		return client{db: pool(t, dsn, n)}
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = int32(n)
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return client{pgx: p}
}

// start starts a run of l's workload on c.
func (c client) start(l *checker.Ledger, workers int, target int64) *checker.Run {
	if c.pgx != nil {
		return l.StartPgx(c.pgx, workers, target)
	}
	return l.Start(c.db, workers, target)
}

// finish is finish on c's pool, and pools. A pgx pool is checked as finish
// checks a *sql.DB: idle, and no advisory lock left, before closing it
// (which would end its sessions, and so their locks), then the goroutines.
func (c client) finish(t testing.TB, l *checker.Ledger, leaks *checker.Leaks, admin *sql.DB, pools ...*sql.DB) {
	t.Helper()
	if c.pgx == nil {
		finish(t, l, leaks, admin, append(pools, c.db)...)
		return
	}
	require.NoError(t, checker.PgxPoolIdle(c.pgx, 10*time.Second))
	require.NoError(t, checker.NoAdvisoryLocks(admin, 10*time.Second))
	c.pgx.Close()
	finish(t, l, leaks, admin, pools...)
}

// variant is a path a workload takes ("direct" or "pgbouncer", see paths)
// and the library it locks with ("txlock" on a *sql.DB, or "pgxlock" on a
// *pgxpool.Pool).
type variant struct{ lib, path string }

// variants are every path with txlock, then with pgxlock.
var variants = []variant{{"txlock", "direct"}, {"txlock", "pgbouncer"}, {"pgxlock", "direct"}, {"pgxlock", "pgbouncer"}}

// name is the variant's subtest name: the path, after the library unless it
// is txlock.
func (v variant) name() string {
	if v.lib == "txlock" {
		return v.path
	}
	return v.lib + "-" + v.path
}

// bouncerDSN selects the pgx exec mode PgBouncer 1.18 needs.
func bouncerDSN(u string) string { return u + "&default_query_exec_mode=exec" }

// paths returns the direct PostgreSQL URL, and the URL a workload on path
// ("direct" or "pgbouncer") connects to.
func paths(t testing.TB, path string) (pg, dsn string) {
	t.Helper()
	pg = pgtest.Postgres(t)
	if path != "pgbouncer" {
		return pg, pg
	}
	u, _ := pgtest.PgBouncer(t)
	return pg, bouncerDSN(u)
}

// hostPort returns the host:port of a connection URL.
func hostPort(t testing.TB, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	return u.Host
}

// withHostPort returns dsn pointed at addr instead.
func withHostPort(t testing.TB, dsn, addr string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Host = addr
	return u.String()
}

// newLedger creates a ledger through admin, dropped when the test ends.
func newLedger(t testing.TB, admin *sql.DB, cfg checker.Config) *checker.Ledger {
	t.Helper()
	l, err := checker.New(context.Background(), admin, cfg)
	require.NoError(t, err)
	return l
}

// check runs the invariant checks and fails t unless all hold.
func check(t testing.TB, l *checker.Ledger, when string, runs ...checker.Summary) checker.Report {
	t.Helper()
	var rep checker.Report
	var err error
	// The admin pool may hold connections broken by a fault: retry.
	for range 20 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		rep, err = l.Check(ctx, runs...)
		cancel()
		if err == nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	require.NoError(t, err, "checking %s", when)
	t.Logf("check %s: %v", when, rep)
	require.True(t, rep.Clean(), "invariant broken %s: %v", when, rep)
	return rep
}

// figures logs a line the README's Reliability table is built from.
func figures(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Logf("FIGURES %s: %s", t.Name(), fmt.Sprintf(format, args...))
}

// requireOnly fails t if the run saw failures outside the allowed classes.
func requireOnly(t testing.TB, s checker.Summary, allowed ...string) {
	t.Helper()
	require.Empty(t, s.Unexpected(allowed...), "failures the fault does not explain (allowed: %v)", allowed)
}

// newLeaks snapshots the goroutines now running. The goroutines that watch
// server processes the test restarts are not leaks of the code under test.
func newLeaks(ignore ...goleak.Option) *checker.Leaks {
	return checker.NewLeaks(append(ignore, goleak.IgnoreAnyFunction("github.com/txlock/txlock/internal/pgtest.startProcess.func1"))...)
}

// finish drops the ledger (if any), then checks that nothing leaked.
func finish(t testing.TB, l *checker.Ledger, leaks *checker.Leaks, admin *sql.DB, pools ...*sql.DB) {
	t.Helper()
	for _, db := range pools {
		require.NoError(t, checker.PoolIdle(db, 10*time.Second))
	}
	require.NoError(t, checker.NoAdvisoryLocks(admin, 10*time.Second))
	if l != nil {
		require.NoError(t, l.Drop(context.Background()))
	}
	leaks.RequireNone(t, admin, pools...)
}

// victim runs WithLock on key through db; fn writes a row to table, sends its
// backend pid, waits for resume, and then runs another statement.
func victim(db *sql.DB, key txlock.Key, table string, opts ...txlock.Option) (pids chan int, resume chan struct{}, done chan error) {
	pids, resume, done = make(chan int, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			var pid int
			if err := tx.QueryRowContext(ctx, `INSERT INTO `+table+` VALUES ('written') RETURNING pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			pids <- pid
			<-resume
			_, err := tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES ('after')`)
			return err
		}, opts...)
	}()
	return pids, resume, done
}

// victim is victim on c's pool: the same fn, on a pgx.Tx with pgxlock.
func (c client) victim(key txlock.Key, table string, opts ...txlock.Option) (pids chan int, resume chan struct{}, done chan error) {
	if c.pgx == nil {
		return victim(c.db, key, table, opts...)
	}
	pids, resume, done = make(chan int, 1), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- pgxlock.WithLock(context.Background(), c.pgx, key, func(ctx context.Context, tx pgx.Tx) error {
			var pid int
			if err := tx.QueryRow(ctx, `INSERT INTO `+table+` VALUES ('written') RETURNING pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			pids <- pid
			<-resume
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ('after')`)
			return err
		}, opts...)
	}()
	return pids, resume, done
}
