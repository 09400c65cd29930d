package pgtest_test

import (
	"context"
	"database/sql"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// withParam returns rawURL with the query parameter key set to value.
func withParam(t testing.TB, rawURL, key, value string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	require.NoError(t, err)
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func openDB(t testing.TB, url string) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() { db.Close() })
	return db
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// ping opens a fresh connection to url and runs a query over it.
func ping(url string) error {
	c, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(c, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var n int
	return conn.QueryRow(c, "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&n)
}

func usingThrowaway() bool {
	return os.Getenv("TXLOCK_TEST_DATABASE_URL") == ""
}

func TestPostgres(t *testing.T) {
	t.Parallel()
	u := pgtest.Postgres(t)
	assert.Equal(t, u, pgtest.Postgres(t), "the shared server is started once")
	db := openDB(t, u)
	var one int
	require.NoError(t, db.QueryRowContext(ctx(t), "SELECT 1").Scan(&one))
	assert.Equal(t, 1, one)

	if !usingThrowaway() {
		return
	}
	assert.True(t, strings.HasPrefix(u, "postgres://txlock@127.0.0.1:"), u)
	var user string
	require.NoError(t, db.QueryRowContext(ctx(t), "SELECT current_user").Scan(&user))
	assert.Equal(t, "txlock", user)
	for name, want := range map[string]string{
		"fsync":            "on",
		"max_connections":  "200",
		"wal_level":        "replica",
		"max_wal_senders":  "5",
		"hot_standby":      "on",
		"listen_addresses": "127.0.0.1",
		"server_encoding":  "UTF8",
		"lc_collate":       "C",
	} {
		var got string
		require.NoError(t, db.QueryRowContext(ctx(t), "SELECT current_setting($1)", name).Scan(&got))
		assert.Equal(t, want, got, name)
	}
}

// Delayed's proxy passes a session through, and each round trip takes at
// least twice its latency.
func TestDelayed(t *testing.T) {
	t.Parallel()
	const latency = 5 * time.Millisecond
	db := openDB(t, pgtest.Delayed(t, pgtest.Postgres(t), latency))
	var one int
	require.NoError(t, db.QueryRowContext(ctx(t), "SELECT 1").Scan(&one)) // opens the connection
	start := time.Now()
	for range 3 {
		require.NoError(t, db.QueryRowContext(ctx(t), "SELECT 1").Scan(&one))
	}
	assert.GreaterOrEqual(t, time.Since(start), 3*2*latency)
}

func TestStandby(t *testing.T) {
	t.Parallel()
	primary := openDB(t, pgtest.Postgres(t))
	standby := openDB(t, pgtest.Standby(t))

	var inRecovery bool
	require.NoError(t, primary.QueryRowContext(ctx(t), "SELECT pg_is_in_recovery()").Scan(&inRecovery))
	assert.False(t, inRecovery, "primary")
	require.NoError(t, standby.QueryRowContext(ctx(t), "SELECT pg_is_in_recovery()").Scan(&inRecovery))
	assert.True(t, inRecovery, "standby")

	// A committed write on the primary is replayed on the standby.
	table := fmt.Sprintf("pgtest_standby_%d", time.Now().UnixNano())
	_, err := primary.ExecContext(ctx(t), "CREATE TABLE "+table+" (v text)")
	require.NoError(t, err)
	t.Cleanup(func() { primary.Exec("DROP TABLE " + table) })
	_, err = primary.ExecContext(ctx(t), "INSERT INTO "+table+" VALUES ('replicated')")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		var v string
		err := standby.QueryRow("SELECT v FROM " + table).Scan(&v)
		return err == nil && v == "replicated"
	}, 15*time.Second, 20*time.Millisecond)

	_, err = standby.ExecContext(ctx(t), "INSERT INTO "+table+" VALUES ('nope')")
	assert.ErrorContains(t, err, "read-only")
}

func TestPgBouncer(t *testing.T) {
	t.Parallel()
	u, admin := pgtest.PgBouncer(t)
	db := openDB(t, withParam(t, u, "default_query_exec_mode", "exec"))
	var sum int
	require.NoError(t, db.QueryRowContext(ctx(t), "SELECT $1::int + 1", 41).Scan(&sum))
	assert.Equal(t, 42, sum)

	tx, err := db.BeginTx(ctx(t), nil)
	require.NoError(t, err)
	var pid1, pid2 int
	require.NoError(t, tx.QueryRowContext(ctx(t), "SELECT pg_backend_pid()").Scan(&pid1))
	require.NoError(t, tx.QueryRowContext(ctx(t), "SELECT pg_backend_pid()").Scan(&pid2))
	assert.Equal(t, pid1, pid2, "a transaction keeps its server connection")
	require.NoError(t, tx.Commit())

	adminDB := openDB(t, admin)
	var found bool
	for _, row := range locktest.Rows(t, adminDB, "SHOW POOLS") {
		if row["database"] == "postgres" {
			found = true
			if mode, ok := row["pool_mode"]; ok {
				assert.Equal(t, "transaction", mode)
			}
		}
	}
	assert.True(t, found, "SHOW POOLS has a row for database postgres")
}

func TestClusterCrashRecovery(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Settings: map[string]string{
		"max_connections": "50",
		"work_mem":        "'8MB'",
	}})
	port := c.Port()
	assert.Equal(t, fmt.Sprintf("postgres://txlock@127.0.0.1:%d/postgres?sslmode=disable", port), c.URL())
	assert.DirExists(t, c.DataDir())

	db := openDB(t, c.URL())
	rows := locktest.Rows(t, db, "SELECT current_setting('max_connections') AS mc, current_setting('work_mem') AS wm")
	require.Len(t, rows, 1)
	assert.Equal(t, "50", rows[0]["mc"], "settings override the defaults")
	assert.Equal(t, "8MB", rows[0]["wm"])

	_, err := db.ExecContext(ctx(t), "CREATE TABLE durable (v text)")
	require.NoError(t, err)
	_, err = db.ExecContext(ctx(t), "INSERT INTO durable VALUES ('committed')")
	require.NoError(t, err)
	require.NoError(t, db.Close())

	require.NoError(t, c.Stop("immediate"))
	assert.Error(t, ping(c.URL()), "stopped server still answers")
	require.NoError(t, c.Stop("immediate"), "stopping a stopped cluster is a no-op")
	require.NoError(t, c.Start())
	assert.Equal(t, port, c.Port())
	assert.ErrorContains(t, c.Start(), "already running")

	count := func() int {
		t.Helper()
		db := openDB(t, c.URL())
		defer db.Close()
		var n int
		require.NoError(t, db.QueryRowContext(ctx(t), "SELECT count(*) FROM durable WHERE v = 'committed'").Scan(&n))
		return n
	}
	assert.Equal(t, 1, count(), "committed row survives an immediate shutdown")

	for _, mode := range []string{"fast", "smart"} {
		require.NoError(t, c.Stop(mode), mode)
		require.NoError(t, c.Start(), mode)
		assert.Equal(t, 1, count(), mode)
	}
	assert.ErrorContains(t, c.Stop("sideways"), "unknown shutdown mode")

	dir := c.DataDir()
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "Close is idempotent")
	assert.NoDirExists(t, dir)
	assert.Error(t, c.Start())
}

func TestStandbyCloseKeepsPrimary(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	s, err := c.StartStandby()
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	assert.NotEqual(t, c.Port(), s.Port())

	db := openDB(t, s.URL())
	var inRecovery bool
	require.NoError(t, db.QueryRowContext(ctx(t), "SELECT pg_is_in_recovery()").Scan(&inRecovery))
	assert.True(t, inRecovery)
	require.NoError(t, db.Close())

	require.NoError(t, s.Close())
	assert.NoDirExists(t, s.DataDir())
	assert.Error(t, ping(s.URL()))
	assert.NoError(t, ping(c.URL()), "closing the standby leaves the primary running")
}

func TestBouncerKillRestart(t *testing.T) {
	t.Parallel()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	b := pgtest.NewBouncer(t, c, pgtest.BouncerOptions{PoolSize: 2})
	port := b.Port()
	assert.Equal(t, fmt.Sprintf("postgres://txlock@127.0.0.1:%d/postgres?sslmode=disable", port), b.URL())
	require.NoError(t, ping(b.URL()))

	adminDB := openDB(t, b.AdminURL())
	config := map[string]string{}
	for _, row := range locktest.Rows(t, adminDB, "SHOW CONFIG") {
		config[row["key"]] = row["value"]
	}
	assert.Equal(t, "2", config["default_pool_size"])
	assert.Equal(t, "transaction", config["pool_mode"])
	require.NoError(t, adminDB.Close())

	require.NoError(t, b.Kill())
	assert.Error(t, ping(b.URL()), "killed bouncer still answers")
	require.NoError(t, b.Kill(), "killing a stopped bouncer is a no-op")
	require.NoError(t, b.Start())
	assert.Equal(t, port, b.Port())
	assert.NoError(t, ping(b.URL()))
	assert.ErrorContains(t, b.Start(), "already running")

	require.NoError(t, b.Stop())
	assert.Error(t, ping(b.URL()), "stopped bouncer still answers")
	require.NoError(t, b.Start())
	assert.NoError(t, ping(b.URL()))

	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "Close is idempotent")
	assert.Error(t, ping(b.URL()))
}

// fakeTB records Skipf and Fatalf instead of ending the test.
type fakeTB struct {
	testing.TB
	skipped, failed string
}

func (f *fakeTB) Helper()                           {}
func (f *fakeTB) Skipf(format string, args ...any)  { f.skipped = fmt.Sprintf(format, args...) }
func (f *fakeTB) Fatalf(format string, args ...any) { f.failed = fmt.Sprintf(format, args...) }
func (f *fakeTB) Fatal(args ...any)                 { f.failed = fmt.Sprint(args...) }

// Not parallel: it changes the environment.
func TestUnavailableFailsUnderCI(t *testing.T) {
	t.Setenv("CI", "")
	f := &fakeTB{TB: t}
	pgtest.Unavailable(f, "set %s", "TXLOCK_TEST_DATABASE_URL")
	assert.Contains(t, f.skipped, "set TXLOCK_TEST_DATABASE_URL")
	assert.Empty(t, f.failed)

	t.Setenv("CI", "true")
	f = &fakeTB{TB: t}
	pgtest.Unavailable(f, "set %s", "TXLOCK_TEST_DATABASE_URL")
	assert.Contains(t, f.failed, "set TXLOCK_TEST_DATABASE_URL")
	assert.Empty(t, f.skipped)

	// Missing binaries fail the test under CI and name the variable to set.
	t.Setenv("TXLOCK_TEST_PG_BINDIR", "/nonexistent")
	f = &fakeTB{TB: t}
	assert.Nil(t, pgtest.NewCluster(f, pgtest.ClusterOptions{}))
	assert.Contains(t, f.failed, "TXLOCK_TEST_PG_BINDIR")
}

// Not parallel: it changes the environment.
func TestEnvironmentOverrides(t *testing.T) {
	t.Setenv("CI", "")
	t.Setenv("TXLOCK_TEST_DATABASE_URL", "postgres://elsewhere/db")
	t.Setenv("TXLOCK_TEST_PGBOUNCER_URL", "")
	t.Setenv("TXLOCK_TEST_STANDBY_URL", "")
	assert.Equal(t, "postgres://elsewhere/db", pgtest.Postgres(t))

	f := &fakeTB{TB: t}
	assert.Empty(t, pgtest.Standby(f))
	assert.Contains(t, f.skipped, "TXLOCK_TEST_STANDBY_URL")

	f = &fakeTB{TB: t}
	u, admin := pgtest.PgBouncer(f)
	assert.Empty(t, u+admin)
	assert.Contains(t, f.skipped, "TXLOCK_TEST_PGBOUNCER_URL")

	t.Setenv("TXLOCK_TEST_PGBOUNCER_URL", "postgres://bouncer/db")
	t.Setenv("TXLOCK_TEST_PGBOUNCER_ADMIN_URL", "")
	f = &fakeTB{TB: t}
	pgtest.PgBouncer(f)
	assert.Contains(t, f.skipped, "TXLOCK_TEST_PGBOUNCER_ADMIN_URL")

	t.Setenv("TXLOCK_TEST_PGBOUNCER_ADMIN_URL", "postgres://bouncer/pgbouncer")
	u, admin = pgtest.PgBouncer(t)
	assert.Equal(t, "postgres://bouncer/db", u)
	assert.Equal(t, "postgres://bouncer/pgbouncer", admin)

	t.Setenv("TXLOCK_TEST_STANDBY_URL", "postgres://standby/db")
	assert.Equal(t, "postgres://standby/db", pgtest.Standby(t))
}
