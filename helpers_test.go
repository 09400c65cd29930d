package txlock_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) {
	// The test binary re-executes itself as a lock holder in some tests.
	if os.Getenv(fenceChildEnv) != "" {
		os.Exit(fenceChild())
	}
	os.Exit(pgtest.Main(m))
}

// open opens url and registers checks that run when the test ends: the pool
// has no connection in use, and the server holds no advisory lock.
func open(t testing.TB, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	db.SetMaxOpenConns(50)
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return db.Stats().InUse == 0 }, 5*time.Second, 10*time.Millisecond,
			"connections still in use: %+v", db.Stats())
		require.NoError(t, db.Close())
	})
	return db
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

func requireNoAdvisoryLocks(t testing.TB, db *sql.DB) {
	t.Helper()
	var n int
	require.Eventually(t, func() bool {
		err := db.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return err == nil && n == 0
	}, 5*time.Second, 10*time.Millisecond, "advisory locks left on the server: %d", n)
}

// uniq returns a string unique to this test run.
func uniq(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "/" + hex.EncodeToString(b[:])
}

// lockArgs renders k as advisory lock function arguments, from the key's
// own Int64 or Pair but independently of the package's rendering. The
// literals are quoted: -9223372036854775808::int8 is the negation of a
// bigint that does not fit, and fails, as does -2147483648::int4.
func lockArgs(k txlock.Key) string {
	if n, ok := k.Int64(); ok {
		return fmt.Sprintf("'%d'::int8", n)
	}
	a, b, _ := k.Pair()
	return fmt.Sprintf("'%d'::int4, '%d'::int4", a, b)
}

// hold takes k on its own connection of db, with the blocking
// pg_advisory_xact_lock (shared if asked), and returns the function that
// releases it.
func hold(t testing.TB, db *sql.DB, k txlock.Key, shared bool) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	fn := "pg_advisory_xact_lock"
	if shared {
		fn += "_shared"
	}
	_, err = tx.ExecContext(ctx, "SELECT "+fn+"("+lockArgs(k)+")")
	require.NoError(t, err)
	// release may run on a timer's goroutine, and again at cleanup.
	var once sync.Once
	release = func() {
		once.Do(func() { assert.NoError(t, tx.Rollback()) })
	}
	t.Cleanup(release)
	return release
}

// heldBy reports whether some backend holds k (granted) on the server.
func heldBy(t testing.TB, db *sql.DB, k txlock.Key) int {
	t.Helper()
	classid, objid, objsubid := txlock.PgLocksOf(k)
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
		AND classid = $1 AND objid = $2 AND objsubid = $3
		AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`,
		int64(classid), int64(objid), objsubid).Scan(&n))
	return n
}

// exampleTB lets runnable examples get the shared test server, which the
// pgtest helpers hand out to a testing.TB. Every failure panics, which fails
// the example.
type exampleTB struct{ testing.TB }

func (exampleTB) Helper()                           {}
func (exampleTB) Fatal(args ...any)                 { panic(fmt.Sprint(args...)) }
func (exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (exampleTB) Skipf(format string, args ...any)  { panic(fmt.Sprintf(format, args...)) }

// exampleDB opens the shared test PostgreSQL for a runnable example.
func exampleDB() *sql.DB {
	db, err := sql.Open("pgx", pgtest.Postgres(exampleTB{}))
	if err != nil {
		panic(err)
	}
	return db
}
