package interop_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/interop"
)

// querier is what a lock statement runs on: a session (*sql.Conn) or a
// transaction (*sql.Tx).
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// TestToolLocksInPgLocks takes each tool's lock as the tool's SQL takes it,
// with the numbers the golden tests pin (computed outside this package),
// reads the row back from pg_locks, and checks that KeyFromPgLocks decodes
// it to the constructor's key, that Identify names the tool, and that
// txlock's transaction lock on that key conflicts with it until it is
// released.
func TestToolLocksInPgLocks(t *testing.T) {
	db := locktest.Open(t, pgtest.Postgres(t), 5)
	ctx := context.Background()
	t.Cleanup(func() {
		var n int
		require.NoError(t, db.QueryRowContext(ctx, `SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory'`).Scan(&n))
		assert.Zero(t, n, "advisory locks left on the server")
	})
	for _, c := range []struct {
		name  string
		tx    bool // the tool takes a transaction lock
		sql   string
		args  []any
		key   txlock.Key
		hints interop.Hints
		tool  string
	}{
		{"hashtext", true, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, []any{"orders:42"},
			interop.HashtextKey("orders:42"), interop.Hints{Names: []string{"orders:42"}}, interop.ToolHashtext},
		{"hashtext, positive", true, `SELECT pg_try_advisory_xact_lock(hashtext($1))`, []any{"a"},
			interop.HashtextKey("a"), interop.Hints{Names: []string{"a"}}, interop.ToolHashtext},
		{"FNV-1a, session lock", false, `SELECT pg_advisory_lock($1)`, []any{int64(5475843843707809360)},
			interop.FNV1a64("orders:42"), interop.Hints{Names: []string{"orders:42"}}, interop.ToolFNV1a64},
		{"django-pglock", false, `SELECT pg_advisory_lock(-823873513912961882)`, nil,
			interop.DjangoPglock("ünïcødé ✓"), interop.Hints{Names: []string{"x", "ünïcødé ✓"}}, interop.ToolDjangoPglock},
		{"django-pglock xact", true, `SELECT pg_advisory_xact_lock(260941440247488394)`, nil,
			interop.DjangoPglock("orders:42"), interop.Hints{Names: []string{"orders:42"}}, interop.ToolDjangoPglock},
		{"with_advisory_lock", false, `SELECT pg_try_advisory_lock(218055877,42) AS t0123abcd /* orders:42 */`, nil,
			interop.WithAdvisoryLock("orders:42", 42), interop.Hints{Names: []string{"orders:42"}}, interop.ToolWithAdvisoryLock},
		{"DistributedLock ASCII", false, `SELECT pg_catalog.pg_advisory_lock($1, $2) AS result`, []any{int32(-540334498), int32(1558000740)},
			interop.DistributedLock("orders:42", false), interop.Hints{Names: []string{"orders:42"}}, interop.ToolDistributedLock},
		{"DistributedLock hashed", true, `SELECT pg_catalog.pg_advisory_xact_lock($1) AS result`, []any{int64(-8279099796375110145)},
			interop.DistributedLock("nightly-report-job", true), interop.Hints{Names: []string{"nightly-report-job"}}, interop.ToolDistributedLock},
		{"golang-migrate", false, `SELECT pg_advisory_lock($1)`, []any{"1787120056"},
			interop.GolangMigrate("app", "", ""), interop.Hints{Database: "app"}, interop.ToolGolangMigrate},
		{"golang-migrate, own table", false, `SELECT pg_advisory_lock($1)`, []any{"3825207687"},
			interop.GolangMigrate("app", "migrate", "schema_migrations"), interop.Hints{Database: "app", MigrateTables: []string{"public.schema_migrations", "migrate.schema_migrations"}}, interop.ToolGolangMigrate},
		{"Rails migrations", false, `SELECT pg_try_advisory_lock(6939591962871035475)`, nil,
			interop.RailsMigrations("app"), interop.Hints{Database: "app"}, interop.ToolRails},
		{"Prisma Migrate", false, `SELECT pg_advisory_lock(72707369)`, nil,
			interop.PrismaMigrate(), interop.Hints{}, interop.ToolPrisma},
		{"Flyway", true, `SELECT pg_try_advisory_xact_lock(77433833903597)`, nil,
			interop.Flyway("", ""), interop.Hints{}, interop.ToolFlyway},
		{"Flyway session", false, `SELECT pg_try_advisory_lock(77431436970681)`, nil,
			interop.Flyway("app", ""), interop.Hints{FlywayTables: []string{"app.flyway_schema_history"}}, interop.ToolFlyway},
	} {
		t.Run(c.name, func(t *testing.T) {
			require.NoError(t, c.key.Err())
			conn, err := db.Conn(ctx)
			require.NoError(t, err)
			defer conn.Close()
			// Whatever the test's outcome, the connection goes back to the
			// pool without a session lock.
			defer conn.ExecContext(ctx, `SELECT pg_catalog.pg_advisory_unlock_all()`)
			var q querier = conn
			var tx *sql.Tx
			if c.tx {
				tx, err = conn.BeginTx(ctx, nil)
				require.NoError(t, err)
				defer tx.Rollback()
				q = tx
			}
			release := func() {
				if tx != nil {
					require.NoError(t, tx.Rollback())
					return
				}
				_, err := conn.ExecContext(ctx, `SELECT pg_catalog.pg_advisory_unlock_all()`)
				require.NoError(t, err)
			}

			var res any // the try functions say whether they got the lock; the others return void
			require.NoError(t, q.QueryRowContext(ctx, c.sql, c.args...).Scan(&res))
			if got, ok := res.(bool); ok {
				require.True(t, got, "the tool's statement did not get the lock")
			}

			var classid, objid int64
			var objsubid int
			var mode string
			require.NoError(t, q.QueryRowContext(ctx, `
				SELECT l.classid::int8, l.objid::int8, l.objsubid, l.mode FROM pg_catalog.pg_locks l
				WHERE l.locktype = 'advisory' AND l.pid = pg_catalog.pg_backend_pid() AND l.granted
				  AND l.database = (SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database())`).
				Scan(&classid, &objid, &objsubid, &mode))
			assert.Equal(t, "ExclusiveLock", mode)
			got, err := txlock.KeyFromPgLocks(uint32(classid), uint32(objid), objsubid)
			require.NoError(t, err)
			assert.Equal(t, c.key, got, "pg_locks shows (%d, %d, %d)", classid, objid, objsubid)
			m, ok := interop.Identify(got, c.hints)
			require.True(t, ok, "Identify(%v, %+v) found no tool", got, c.hints)
			assert.Equal(t, c.tool, m.Tool, m.Label)
			t.Logf("pg_locks (%d, %d, %d): %s", classid, objid, objsubid, m.Label)

			// txlock's transaction lock on the same key waits for the tool's.
			ran := false
			acquired, err := txlock.TryWithLock(ctx, db, c.key, func(context.Context, *sql.Tx) error { ran = true; return nil })
			require.NoError(t, err)
			assert.False(t, acquired || ran, "txlock got %v while the tool held it", c.key)
			release()
			acquired, err = txlock.TryWithLock(ctx, db, c.key, func(context.Context, *sql.Tx) error { ran = true; return nil })
			require.NoError(t, err)
			assert.True(t, acquired && ran, "txlock did not get %v after the tool released it", c.key)
		})
	}
}
