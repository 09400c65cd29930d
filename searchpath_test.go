package txlock_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// A connection whose search_path lists a schema before pg_catalog finds that
// schema's functions, operators, types and relations first. These tests
// give the library such connections, where a schema shadows every name its
// statements use, and check that it still locks, fences and reports
// exactly as it does on a clean connection, and that it never reached one
// of the shadows.

// shadow is an object of the hostile schema, and an unqualified statement
// that reaches it on a connection whose search_path lists the schema first.
// Its ddl is a format string: %[1]s is the schema, %[2]s the statement that
// records the call (PERFORM %[1]s.hit('<name>')).
type shadow struct {
	name  string // also names the sequence that counts its calls: "hit <name>", at most 63 bytes
	ddl   string
	probe string
}

// fn returns the shadow of a function: a PL/pgSQL function with the given
// signature and return type whose body records the call and then runs do.
func fn(sig, returns, do, probe string) shadow {
	return shadow{
		name: strings.ReplaceAll(sig, "pg_catalog.", ""),
		ddl: `CREATE FUNCTION %[1]s.` + sig + ` RETURNS ` + returns + ` LANGUAGE plpgsql SET search_path = pg_catalog AS $$BEGIN %[2]s; ` +
			do + `; END$$`,
		probe: probe,
	}
}

// op returns the shadow of a binary operator, implemented by a function
// named impl that records the call and returns result.
func op(name, left, right, returns, impl, result, probe string) shadow {
	return shadow{
		name: "operator " + name + " (" + left + ", " + right + ")",
		ddl: `CREATE FUNCTION %[1]s.` + impl + `(pg_catalog.` + left + `, pg_catalog.` + right + `) RETURNS pg_catalog.` + returns +
			` LANGUAGE plpgsql SET search_path = pg_catalog AS $$BEGIN %[2]s; RETURN ` + result + `; END$$;
			CREATE OPERATOR %[1]s.` + name + ` (LEFTARG = pg_catalog.` + left + `, RIGHTARG = pg_catalog.` + right + `, FUNCTION = %[1]s.` + impl + `)`,
		probe: probe,
	}
}

// domain returns the shadow of a type name: a domain over the real type
// whose check records every value cast to it.
func domain(name string) shadow {
	return shadow{
		name:  "type " + name,
		ddl:   `CREATE DOMAIN %[1]s.` + name + ` AS pg_catalog.` + name + ` CHECK (%[1]s.hit('type ` + name + `'))`,
		probe: `SELECT '1'::` + name,
	}
}

// shadows is every name the library's statements use, in lockStatement,
// waitStatement, termStatement and a term's heartbeat, Fencer.Token, Fencer.CreateSequence and the FencedTable
// writes, each doing what would most mislead the library: a lock function
// grants without locking, pg_is_in_recovery says standby, set_config sets
// nothing, comparisons say true, the clocks make any transaction_timeout in
// force look as if it ends later than the hold bound. The key columns of the test's own fenced
// table are bigint, whose = is deliberately not shadowed: a fenced write
// compares the caller's columns with the caller's operators (see
// fencedStmt.match).
var shadows = []shadow{
	fn("pg_try_advisory_xact_lock(pg_catalog.int8)", "pg_catalog.bool", "RETURN true", "SELECT pg_try_advisory_xact_lock(1::bigint)"),
	fn("pg_try_advisory_xact_lock(pg_catalog.int4, pg_catalog.int4)", "pg_catalog.bool", "RETURN true", "SELECT pg_try_advisory_xact_lock(1::integer, 2::integer)"),
	fn("pg_try_advisory_xact_lock_shared(pg_catalog.int8)", "pg_catalog.bool", "RETURN true", "SELECT pg_try_advisory_xact_lock_shared(1::bigint)"),
	fn("pg_try_advisory_xact_lock_shared(pg_catalog.int4, pg_catalog.int4)", "pg_catalog.bool", "RETURN true", "SELECT pg_try_advisory_xact_lock_shared(1::integer, 2::integer)"),
	fn("pg_advisory_xact_lock(pg_catalog.int8)", "void", "RETURN", "SELECT pg_advisory_xact_lock(1::bigint)"),
	fn("pg_advisory_xact_lock(pg_catalog.int4, pg_catalog.int4)", "void", "RETURN", "SELECT pg_advisory_xact_lock(1::integer, 2::integer)"),
	fn("pg_advisory_xact_lock_shared(pg_catalog.int8)", "void", "RETURN", "SELECT pg_advisory_xact_lock_shared(1::bigint)"),
	fn("pg_advisory_xact_lock_shared(pg_catalog.int4, pg_catalog.int4)", "void", "RETURN", "SELECT pg_advisory_xact_lock_shared(1::integer, 2::integer)"),
	fn("pg_is_in_recovery()", "pg_catalog.bool", "RETURN true", "SELECT pg_is_in_recovery()"),
	fn("set_config(pg_catalog.text, pg_catalog.text, pg_catalog.bool)", "pg_catalog.text", "RETURN $2", "SELECT set_config('application_name', 'x', true)"),
	fn("current_setting(pg_catalog.text)", "pg_catalog.text", "RETURN 'evil'", "SELECT current_setting('lock_timeout')"),
	fn("current_setting(pg_catalog.text, pg_catalog.bool)", "pg_catalog.text", "RETURN 'evil'", "SELECT current_setting('lock_timeout', true)"),
	fn("concat(pg_catalog.text, pg_catalog.text)", "pg_catalog.text", "RETURN 'evil'", "SELECT concat('a', 'b'::pg_catalog.text)"),
	fn("generate_series(pg_catalog.int4, pg_catalog.int4)", "SETOF pg_catalog.int4", "RETURN NEXT 1", "SELECT generate_series(1, 0)"),
	fn("generate_series(pg_catalog.int8, pg_catalog.int8)", "SETOF pg_catalog.int8", "RETURN NEXT 1", "SELECT generate_series(1::bigint, 0::bigint)"),
	fn("nextval(pg_catalog.regclass)", "pg_catalog.int8", "RETURN 1", "SELECT nextval('pg_catalog.pg_class'::pg_catalog.regclass)"),
	fn("pg_current_xact_id()", "pg_catalog.xid8", "RETURN '1'", "SELECT pg_current_xact_id()"),
	fn("pg_backend_pid()", "pg_catalog.int4", "RETURN 0", "SELECT pg_backend_pid()"),
	fn("transaction_timestamp()", "pg_catalog.timestamptz", "RETURN 'infinity'", "SELECT transaction_timestamp()"),
	fn("clock_timestamp()", "pg_catalog.timestamptz", "RETURN '-infinity'", "SELECT clock_timestamp()"),
	{
		name: "count(*)",
		ddl: `CREATE FUNCTION %[1]s.count_step(pg_catalog.int8) RETURNS pg_catalog.int8 LANGUAGE plpgsql SET search_path = pg_catalog AS $$BEGIN %[2]s; RETURN 1000; END$$;
			CREATE AGGREGATE %[1]s.count(*) (SFUNC = %[1]s.count_step, STYPE = pg_catalog.int8, INITCOND = '1000')`,
		probe: "SELECT count(*) FROM (VALUES (1)) v",
	},
	{
		name: "max(pg_catalog.int8)",
		ddl: `CREATE FUNCTION %[1]s.max_step(pg_catalog.int8, pg_catalog.int8) RETURNS pg_catalog.int8 LANGUAGE plpgsql SET search_path = pg_catalog AS $$BEGIN %[2]s; RETURN 0; END$$;
			CREATE AGGREGATE %[1]s.max(pg_catalog.int8) (SFUNC = %[1]s.max_step, STYPE = pg_catalog.int8, INITCOND = '0')`,
		probe: "SELECT max(x) FROM (VALUES (1::bigint)) v(x)",
	},
	op("=", "text", "text", "bool", "text_eq", "true", "SELECT 'a'::pg_catalog.text = 'b'::pg_catalog.text"),
	op("=", "int4", "int4", "bool", "int4_eq", "true", "SELECT 1::integer = 2::integer"),
	op("=", "oid", "oid", "bool", "oid_eq", "true", "SELECT '1'::pg_catalog.oid = '2'::pg_catalog.oid"),
	op(">", "int8", "int4", "bool", "int84_gt", "true", "SELECT 1::bigint > 2::integer"),
	op("<=", "int8", "int8", "bool", "int8_le", "true", "SELECT 2::bigint <= 1::bigint"),
	op("||", "text", "text", "text", "text_cat", "'evil'", "SELECT 'a'::pg_catalog.text || 'b'::pg_catalog.text"),
	op("+", "timestamptz", "interval", "timestamptz", "timestamptz_pl_interval", "'infinity'", "SELECT pg_catalog.now() + '1s'::interval"),
	op(">", "timestamptz", "timestamptz", "bool", "timestamptz_gt", "true", "SELECT pg_catalog.now() > pg_catalog.now()"),
	domain("int8"),
	domain("int4"),
	domain("text"),
	domain("regclass"),
	{
		name: "pg_sequence",
		ddl: `CREATE VIEW %[1]s.pg_sequence AS SELECT oid AS seqrelid, 1000::bigint AS seqcache FROM pg_catalog.pg_class
			WHERE %[1]s.hit('pg_sequence')`,
		probe: "SELECT 1 FROM pg_sequence LIMIT 1",
	},
}

// evilStart is where the hostile schema's fencing sequence starts: far from
// anything the real one reaches in a test.
const evilStart = 1_000_000_000_000

// hostile is a schema that shadows every name in shadows, and holds a
// sequence named like the default fencing sequence.
type hostile struct {
	schema string
	clean  *sql.DB // sees the schema only by qualified names
	evil   *sql.DB // search_path: the schema, then pg_catalog
}

// createHostile creates the hostile schema on clean's database, dropped when
// the test ends.
func createHostile(t *testing.T, clean *sql.DB) *hostile {
	t.Helper()
	var b [6]byte
	_, _ = rand.Read(b[:])
	h := &hostile{schema: "txlock_evil_" + hex.EncodeToString(b[:]), clean: clean}
	var ddl strings.Builder
	fmt.Fprintf(&ddl, `CREATE SCHEMA %[1]s;
		CREATE FUNCTION %[1]s.hit(what pg_catalog.text) RETURNS pg_catalog.bool LANGUAGE plpgsql SET search_path = pg_catalog AS $$BEGIN
			PERFORM pg_catalog.nextval(pg_catalog.format('%%I.%%I', %[2]s, 'hit ' OPERATOR(pg_catalog.||) what)::pg_catalog.regclass);
			RETURN true;
		END$$;
		CREATE SEQUENCE %[1]s.%[3]s START %[4]d;
		`, h.schema, "'"+h.schema+"'", txlock.DefaultFenceSequence, evilStart)
	for _, s := range shadows {
		fmt.Fprintf(&ddl, "CREATE SEQUENCE %s.%q;\n", h.schema, "hit "+s.name)
		fmt.Fprintf(&ddl, s.ddl+";\n", h.schema, "PERFORM "+h.schema+".hit('"+s.name+"')")
	}
	_, err := clean.Exec(ddl.String())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := clean.Exec(`DROP SCHEMA ` + h.schema + ` CASCADE`)
		assert.NoError(t, err)
	})
	return h
}

// searchPath returns the search_path of the hostile pool.
func (h *hostile) searchPath() string { return h.schema + ",pg_catalog" }

// hits returns how many times each shadow was called, by name.
func (h *hostile) hits(t *testing.T) map[string]int64 {
	t.Helper()
	rows, err := h.clean.Query(`SELECT substr(sequencename, 5), last_value FROM pg_catalog.pg_sequences
		WHERE schemaname = $1 AND sequencename LIKE 'hit %' AND last_value IS NOT NULL`, h.schema)
	require.NoError(t, err)
	defer rows.Close()
	n := map[string]int64{}
	for rows.Next() {
		var name string
		var v int64
		require.NoError(t, rows.Scan(&name, &v))
		n[name] = v
	}
	require.NoError(t, rows.Err())
	return n
}

// check proves the fixture works: every shadow is reached by its unqualified
// probe on the hostile pool, and counted. It returns the counts, for
// noNewHits.
func (h *hostile) check(t *testing.T) map[string]int64 {
	t.Helper()
	var path string
	require.NoError(t, h.evil.QueryRow(`SELECT pg_catalog.current_setting('search_path')`).Scan(&path))
	require.Equal(t, h.searchPath(), strings.ReplaceAll(path, " ", ""), "the hostile pool's search_path")
	for _, s := range shadows {
		tx, err := h.evil.Begin()
		require.NoError(t, err)
		_, err = tx.Exec(s.probe)
		assert.NoError(t, err, "probe of %s: %s", s.name, s.probe)
		require.NoError(t, tx.Rollback())
	}
	got := h.hits(t)
	for _, s := range shadows {
		assert.Positive(t, got[s.name], "the probe %q did not reach the shadow %s", s.probe, s.name)
	}
	return got
}

// noNewHits fails the test for every shadow called since before was taken.
func (h *hostile) noNewHits(t *testing.T, before map[string]int64) {
	t.Helper()
	after := h.hits(t)
	var called []string
	for _, name := range slices.Sorted(maps.Keys(after)) {
		if n := after[name] - before[name]; n > 0 {
			called = append(called, fmt.Sprintf("%s (%d times)", name, n))
		}
	}
	assert.Empty(t, called, "the library called these objects of schema %s instead of pg_catalog's", h.schema)
}

// withSearchPath returns the connection string dsn with search_path set, as
// a startup parameter that pgx sends to the server. dsn is a URL or a
// keyword/value string.
func withSearchPath(t *testing.T, dsn, path string) string {
	t.Helper()
	if !strings.HasPrefix(dsn, "postgres://") && !strings.HasPrefix(dsn, "postgresql://") {
		return dsn + " search_path='" + path + "'"
	}
	return locktest.WithParam(t, dsn, "search_path", path)
}

// hostileDirect returns a hostile schema on the shared test server, and a
// pool on it whose search_path lists the schema before pg_catalog.
func hostileDirect(t *testing.T) *hostile {
	t.Helper()
	h := createHostile(t, direct(t))
	h.evil = open(t, withSearchPath(t, pgtest.Postgres(t), h.searchPath()))
	return h
}

// hostileBouncer returns a hostile schema on a server of its own, and a
// pool through PgBouncer in front of it whose server connections have the
// hostile search_path. PgBouncer 1.18 refuses search_path and options as
// startup parameters ("unsupported startup parameter", 08P01), and a SET
// would leak to other clients, so the server's database default is set
// instead, before PgBouncer opens a connection to it.
func hostileBouncer(t *testing.T) *hostile {
	t.Helper()
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	clean := open(t, withSearchPath(t, c.URL(), "public"))
	t.Cleanup(func() { requireNoAdvisoryLocks(t, clean) })
	h := createHostile(t, clean)
	_, err := clean.Exec(`ALTER DATABASE postgres SET search_path = ` + h.searchPath())
	require.NoError(t, err)
	b := pgtest.NewBouncer(t, c, pgtest.BouncerOptions{})
	h.evil = open(t, b.URL()+"&default_query_exec_mode=exec")
	return h
}

var errNotAcquired = errors.New("the Try call did not acquire the lock")

// lockCall is one way into the lock: it runs fn under keys, or returns an
// error (errNotAcquired for a Try call that found the lock busy).
type lockCall struct {
	name  string
	nkeys int
	run   func(ctx context.Context, db *sql.DB, keys []txlock.Key, fn func(context.Context, *sql.Tx) error, opts ...txlock.Option) error
	busy  error // what the call returns while another connection holds a key
	check func(t *testing.T, ctx context.Context, tx *sql.Tx)
}

func withLock(opt ...txlock.Option) func(context.Context, *sql.DB, []txlock.Key, func(context.Context, *sql.Tx) error, ...txlock.Option) error {
	return func(ctx context.Context, db *sql.DB, keys []txlock.Key, fn func(context.Context, *sql.Tx) error, opts ...txlock.Option) error {
		return txlock.WithLock(ctx, db, keys[0], fn, append(opts, opt...)...)
	}
}

func withLocks(opt ...txlock.Option) func(context.Context, *sql.DB, []txlock.Key, func(context.Context, *sql.Tx) error, ...txlock.Option) error {
	return func(ctx context.Context, db *sql.DB, keys []txlock.Key, fn func(context.Context, *sql.Tx) error, opts ...txlock.Option) error {
		return txlock.WithLocks(ctx, db, keys, fn, append(opts, opt...)...)
	}
}

func lockTx(opt ...txlock.Option) func(context.Context, *sql.DB, []txlock.Key, func(context.Context, *sql.Tx) error, ...txlock.Option) error {
	return func(ctx context.Context, db *sql.DB, keys []txlock.Key, fn func(context.Context, *sql.Tx) error, opts ...txlock.Option) error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := txlock.LockTx(ctx, tx, keys[0], append(opts, opt...)...); err != nil {
			return err
		}
		if err := fn(ctx, tx); err != nil {
			return err
		}
		return tx.Commit()
	}
}

// termCall runs fn in a term's context (without a transaction: a term's makes
// no writes and is not the caller's), after a few heartbeats, through Lead
// or AcquireTerm. It creates the fencing sequence first, which a term
// draws its token from.
func termCall(lead bool) func(context.Context, *sql.DB, []txlock.Key, func(context.Context, *sql.Tx) error, ...txlock.Option) error {
	return func(ctx context.Context, db *sql.DB, keys []txlock.Key, fn func(context.Context, *sql.Tx) error, opts ...txlock.Option) error {
		if err := (txlock.Fencer{}).CreateSequence(ctx, db); err != nil {
			return err
		}
		// Heartbeats every 50ms, each with a Timeout and the term a TTL that
		// a loaded machine's pause of a second cannot reach.
		termOpts := []txlock.TermOption{txlock.WithHeartbeat(txlock.Heartbeat{Interval: 50 * time.Millisecond, Timeout: 3 * time.Second, TTL: 4 * time.Second})}
		for _, o := range opts {
			termOpts = append(termOpts, o)
		}
		run := func(ctx context.Context, t *txlock.Term) error {
			time.Sleep(200 * time.Millisecond) // heartbeats
			if err := t.Err(); err != nil {
				return err
			}
			return fn(ctx, nil)
		}
		if lead {
			return txlock.Lead(ctx, db, keys[0], run, termOpts...)
		}
		t, err := txlock.AcquireTerm(ctx, db, keys[0], termOpts...)
		if err != nil {
			return err
		}
		err = run(t.Context(), t)
		return errors.Join(err, t.Release(ctx))
	}
}

// setting returns a server setting as fn's transaction sees it.
func setting(t *testing.T, ctx context.Context, tx *sql.Tx, name string) string {
	t.Helper()
	var v string
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT pg_catalog.current_setting($1)`, name).Scan(&v))
	return v
}

var lockCalls = []lockCall{
	{name: "WithLock", nkeys: 1, run: withLock(), busy: txlock.ErrLockTimeout},
	{name: "WithLocks", nkeys: 3, run: withLocks(), busy: txlock.ErrLockTimeout},
	{name: "WithShared", nkeys: 1, run: withLock(txlock.WithShared()), busy: txlock.ErrLockTimeout},
	{name: "WithLocks WithShared", nkeys: 3, run: withLocks(txlock.WithShared()), busy: txlock.ErrLockTimeout},
	{
		name: "TryWithLock", nkeys: 1, busy: errNotAcquired,
		run: func(ctx context.Context, db *sql.DB, keys []txlock.Key, fn func(context.Context, *sql.Tx) error, opts ...txlock.Option) error {
			ok, err := txlock.TryWithLock(ctx, db, keys[0], fn, opts...)
			if err == nil && !ok {
				return errNotAcquired
			}
			return err
		},
	},
	{name: "LockTx", nkeys: 1, run: lockTx(), busy: txlock.ErrLockTimeout},
	{
		name: "ServerWait", nkeys: 1, busy: txlock.ErrLockTimeout,
		run: withLock(txlock.WithServerWait(txlock.ServerWait{Window: 50 * time.Millisecond})),
		check: func(t *testing.T, ctx context.Context, tx *sql.Tx) {
			assert.Equal(t, "0", setting(t, ctx, tx, "lock_timeout"), "ServerWait restores lock_timeout for fn")
		},
	},
	{name: "WithLocks ServerWait", nkeys: 3, run: withLocks(txlock.WithServerWait(txlock.ServerWait{Window: 50 * time.Millisecond})), busy: txlock.ErrLockTimeout},
	{name: "LockTx ServerWait", nkeys: 1, run: lockTx(txlock.WithServerWait(txlock.ServerWait{Window: 50 * time.Millisecond})), busy: txlock.ErrLockTimeout},
	{name: "AcquireTerm", nkeys: 1, run: termCall(false), busy: txlock.ErrLockTimeout},
	{name: "Lead", nkeys: 1, run: termCall(true), busy: txlock.ErrLockTimeout},
	{
		name: "WithMaxHold", nkeys: 1, busy: txlock.ErrLockTimeout,
		run: withLock(txlock.WithMaxHold(7 * time.Second)),
		check: func(t *testing.T, ctx context.Context, tx *sql.Tx) {
			assert.Equal(t, "7s", setting(t, ctx, tx, "idle_in_transaction_session_timeout"), "the hold bound is set on the server")
		},
	},
}

// testLocks runs every lockCall on h's hostile pool: it must be excluded by
// a holder on a clean connection, and with no holder it must run fn under
// locks that pg_locks shows, on a primary.
func testLocks(t *testing.T, h *hostile) {
	before := h.check(t)
	ctx := context.Background()
	for _, c := range lockCalls {
		t.Run(c.name, func(t *testing.T) {
			// Bigint and pair keys; the last, which a clean connection
			// holds in (1), is a pair when there are several.
			keys := []txlock.Key{txlock.StringKey(uniq(t)), txlock.StringKey(uniq(t)), txlock.NewKeyspace(uniq(t)).Key("x")}[:c.nkeys]

			// (1) Another connection holds the last key: fn must not run.
			release := hold(t, h.clean, keys[len(keys)-1], false)
			ran := false
			err := c.run(ctx, h.evil, keys, func(context.Context, *sql.Tx) error {
				ran = true
				return nil
			}, txlock.WithTimeout(250*time.Millisecond))
			assert.False(t, ran, "fn ran while another connection held %v", keys[len(keys)-1])
			require.ErrorIs(t, err, c.busy)
			release()

			// (2) No holder: fn runs, under locks the server shows.
			ran = false
			err = c.run(ctx, h.evil, keys, func(ctx context.Context, tx *sql.Tx) error {
				ran = true
				for _, k := range keys {
					assert.Equal(t, 1, heldBy(t, h.clean, k), "%v is not held on the server", k)
				}
				if c.check != nil {
					c.check(t, ctx, tx)
				}
				return nil
			})
			require.NoError(t, err, "a primary, not a standby, and the lock is free")
			assert.True(t, ran)
		})
	}
	h.noNewHits(t, before)
}

// testFencing draws tokens and writes through h's hostile pool: the token
// comes from the real sequence, and stale writes are refused.
func testFencing(t *testing.T, h *hostile) {
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, h.clean))
	// Draw one, so that the test's token is at least 2 and token-1 a valid,
	// stale token.
	_, err := h.clean.Exec(`SELECT nextval('` + txlock.DefaultFenceSchema + "." + txlock.DefaultFenceSequence + `')`)
	require.NoError(t, err)
	table := "fenced_" + h.schema
	_, err = h.clean.Exec(`CREATE TABLE public.` + table + ` (id bigint PRIMARY KEY, qty int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO public.` + table + ` VALUES (1, 50, 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = h.clean.Exec(`DROP TABLE public.` + table) })
	before := h.check(t)

	// CreateSequence reads pg_catalog.pg_sequence, not the shadow that
	// reports a CACHE of 1000 for every relation.
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, h.evil))

	lastValue := func(seq string) (v int64, called bool) {
		require.NoError(t, h.clean.QueryRow(`SELECT last_value, is_called FROM `+seq).Scan(&v, &called))
		return v, called
	}
	var token int64
	require.NoError(t, txlock.WithLock(ctx, h.evil, txlock.StringKey(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
		var err error
		token, err = txlock.FenceToken(ctx)
		require.NoError(t, err)
		real, _ := lastValue(txlock.DefaultFenceSchema + "." + txlock.DefaultFenceSequence)
		assert.Equal(t, real, token, "the token is the real sequence's last value")
		return nil
	}))
	v, called := lastValue(h.schema + "." + txlock.DefaultFenceSequence)
	assert.False(t, called, "the hostile schema's sequence was drawn from")
	assert.EqualValues(t, evilStart, v)
	require.Greater(t, token, int64(1))

	ft := txlock.FencedTable{Schema: "public", Name: table}
	id := func(n int64) []txlock.Col { return []txlock.Col{{Name: "id", Value: n}} }
	qty := func(n int) []txlock.Col { return []txlock.Col{{Name: "qty", Value: n}} }
	row := func(n int64) (qty int, tok int64) {
		require.NoError(t, h.clean.QueryRow(`SELECT qty, fence_token FROM public.`+table+` WHERE id = $1`, n).Scan(&qty, &tok))
		return qty, tok
	}
	stale := func(err error) {
		t.Helper()
		var e *txlock.StaleTokenError
		require.ErrorAs(t, err, &e)
		assert.Equal(t, token-1, e.Token)
		assert.Equal(t, token, e.Current)
	}

	n, err := ft.Update(ctx, h.evil, token, qty(42), id(1))
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	_, err = ft.Update(ctx, h.evil, token-1, qty(49), id(1))
	stale(err)
	_, err = ft.Delete(ctx, h.evil, token-1, id(1))
	stale(err)
	q, tok := row(1)
	assert.Equal(t, 42, q)
	assert.Equal(t, token, tok)

	require.NoError(t, ft.Upsert(ctx, h.evil, token, id(2), qty(7)))
	stale(ft.Upsert(ctx, h.evil, token-1, id(2), qty(8)))
	q, tok = row(2)
	assert.Equal(t, 7, q)
	assert.Equal(t, token, tok)

	n, err = ft.Delete(ctx, h.evil, token, id(2))
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	_, err = ft.Delete(ctx, h.evil, token, id(2))
	assert.ErrorIs(t, err, txlock.ErrRowNotFound)
	h.noNewHits(t, before)
}

// TestSearchPathCannotSubvert runs the library on connections whose
// search_path lists the hostile schema first: directly, with search_path as
// a startup parameter, and through PgBouncer, with the database's default.
func TestSearchPathCannotSubvert(t *testing.T) {
	for _, via := range []struct {
		name string
		h    func(*testing.T) *hostile
	}{{"direct", hostileDirect}, {"PgBouncer", hostileBouncer}} {
		t.Run(via.name, func(t *testing.T) {
			h := via.h(t)
			t.Run("locks", func(t *testing.T) { testLocks(t, h) })
			t.Run("fencing", func(t *testing.T) { testFencing(t, h) })
		})
	}
}
