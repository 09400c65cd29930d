package txlock_test

import (
	"database/sql"
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) {
	// The test binary re-executes itself as a lock holder in some tests.
	if os.Getenv(fenceChildEnv) != "" {
		os.Exit(fenceChild())
	}
	os.Exit(pgtest.Main(m))
}

// direct returns a pool on the test PostgreSQL, checking after the test that
// no advisory lock is left on the server.
func direct(t testing.TB) *sql.DB {
	t.Helper()
	db := open(t, pgtest.Postgres(t))
	t.Cleanup(func() { requireNoAdvisoryLocks(t, db) })
	return db
}

// bouncer returns a pool through the test PgBouncer with the given pgx
// default_query_exec_mode ("" for pgx's default), and the admin console URL.
func bouncer(t testing.TB, mode string) (*sql.DB, string) {
	t.Helper()
	url, admin := pgtest.PgBouncer(t)
	if mode != "" {
		url += "&default_query_exec_mode=" + mode
	}
	direct(t) // registers the no-advisory-lock check on the server
	return open(t, url), admin
}

// The helpers shared with the adapter modules' tests.
var (
	uniq     = locktest.Uniq
	lockArgs = locktest.LockArgs
	hold     = locktest.Hold
	hammer   = locktest.Hammer // workers goroutines, iters calls each: the errors
)

// open opens url and registers checks that run when the test ends: the pool
// has no connection in use.
func open(t testing.TB, url string) *sql.DB { return locktest.Open(t, url, 50) }

func requireNoAdvisoryLocks(t testing.TB, db *sql.DB) { locktest.RequireNoAdvisoryLocks(t, db) }

// heldBy returns how many backends hold k (granted) on the server.
var heldBy = locktest.HeldBy

// exampleDB opens the shared test PostgreSQL for a runnable example.
func exampleDB() *sql.DB {
	db, err := sql.Open("pgx", pgtest.ExampleURL())
	if err != nil {
		panic(err)
	}
	return db
}
