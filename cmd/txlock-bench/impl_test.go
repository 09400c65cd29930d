package main

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// testEnv opens an env of one connection per pool on url.
func testEnv(t *testing.T, url string) *env {
	t.Helper()
	b := &bench{stmts: &counter{}}
	db, err := b.pool(url)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	t.Cleanup(func() { db.Close() })
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.Tracer = b.stmts
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return &env{db: db, pgx: p, stmts: b.stmts}
}

const heldLocksSQL = `/*fn*/ SELECT (SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()), pg_catalog.pg_backend_pid()`

// heldLocks is a fn that reports how many advisory locks its own backend
// holds, and under which backend pid.
func heldLocks(n, pid *int) work {
	return work{
		sql: func(ctx context.Context, tx *sql.Tx, id int) error {
			return tx.QueryRowContext(ctx, heldLocksSQL).Scan(n, pid)
		},
		pgx: func(ctx context.Context, q pgxQuerier, id int) error {
			return q.QueryRow(ctx, heldLocksSQL).Scan(n, pid)
		},
	}
}

// connState returns the backend pid and transaction status of the
// implementation's one connection, from the pool it uses.
func connState(t *testing.T, e *env, im impl) (pid int, status byte) {
	t.Helper()
	ctx := context.Background()
	if im.name == "plain-tx+bare-lock" {
		c, err := e.db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Raw(func(dc any) error {
			pc := dc.(*stdlib.Conn).Conn()
			status = pc.PgConn().TxStatus()
			return pc.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid)
		}); err != nil {
			t.Fatal(err)
		}
		return pid, status
	}
	c, err := e.pgx.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	status = c.Conn().PgConn().TxStatus()
	if err := c.QueryRow(ctx, "SELECT pg_catalog.pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	return pid, status
}

// TestBareLockReferences checks the two references that try the bare lock
// function once: granted, fn runs holding it and it is released at commit;
// busy, they return errBusy without running fn, and roll back, keeping
// their connection idle.
func TestBareLockReferences(t *testing.T) {
	url := pgtest.Postgres(t)
	other, err := sql.Open("pgx", url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	ctx := context.Background()
	const id = 42
	for _, im := range []impl{plainTxBareLock, plainPgxBareLockInBegin} {
		t.Run(im.name, func(t *testing.T) {
			e := testEnv(t, url)
			var n, pid int
			granted := 0
			if err := im.run(ctx, e, id, heldLocks(&n, &pid), func() { granted++ }); err != nil {
				t.Fatal(err)
			}
			if granted != 1 || n != 1 {
				t.Fatalf("granted %d times, fn's backend held %d advisory locks; want 1 and 1", granted, n)
			}
			if p, status := connState(t, e, im); p != pid || status != 'I' {
				t.Fatalf("after commit: backend %d in state %c, want %d idle", p, status, pid)
			}
			var left int
			if err := other.QueryRowContext(ctx, `SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND objid::bigint = ($1::bigint & 4294967295) AND classid::bigint = ($1::bigint >> 32 & 4294967295)`, lockInt64(id)).Scan(&left); err != nil {
				t.Fatal(err)
			}
			if left != 0 {
				t.Fatalf("%d advisory locks on the key after commit, want 0", left)
			}

			holder, err := other.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = holder.Rollback() }()
			if _, err := holder.ExecContext(ctx, "SELECT pg_catalog.pg_advisory_xact_lock("+lockArgs(id)+")"); err != nil {
				t.Fatal(err)
			}
			ran := false
			busy := work{
				sql: func(context.Context, *sql.Tx, int) error { ran = true; return nil },
				pgx: func(context.Context, pgxQuerier, int) error { ran = true; return nil },
			}
			err = im.run(ctx, e, id, busy, func() { granted++ })
			if !errors.Is(err, errBusy) || ran || granted != 1 {
				t.Fatalf("with the lock held elsewhere: err %v, fn ran %v, granted %d times; want errBusy, false, 1", err, ran, granted)
			}
			if p, status := connState(t, e, im); p != pid || status != 'I' {
				t.Fatalf("after a busy try: backend %d in state %c, want %d idle (rolled back, connection kept)", p, status, pid)
			}
		})
	}
}

// roundTrips returns the times of 51 SELECT 1 round trips on one
// connection to url, sorted, as medianRoundTrip measures them.
func roundTrips(ctx context.Context, url string) ([]time.Duration, error) {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer c.Close(ctx)
	var ds []time.Duration
	for range 51 {
		t0 := time.Now()
		if _, err := c.Exec(ctx, "SELECT 1"); err != nil {
			return nil, err
		}
		ds = append(ds, time.Since(t0))
	}
	slices.Sort(ds)
	return ds, nil
}

// TestSimulatedNetwork checks that the proxy delays a round trip by about
// twice its latency: the fastest round trip through it by at least that,
// which holds whatever the machine's load, and by no more than 4ms beyond
// the fastest direct one. Both bounds are on the fastest round trips,
// which a loaded machine's scheduling delays (several milliseconds on half
// of the round trips, at times, with every core busy) seldom reach: what
// the upper one bounds is the proxy's own cost.
func TestSimulatedNetwork(t *testing.T) {
	url := pgtest.Postgres(t)
	addr, err := hostPort(url)
	if err != nil {
		t.Fatal(err)
	}
	const latency = 500 * time.Microsecond
	px, err := startProxy("test", addr, latency)
	if err != nil {
		t.Fatal(err)
	}
	defer px.close()
	purl, err := viaProxy(url, px.addr())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	direct, err := roundTrips(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	proxied, err := roundTrips(ctx, purl)
	if err != nil {
		t.Fatal(err)
	}
	median := func(ds []time.Duration) time.Duration { return ds[len(ds)/2] }
	t.Logf("round trip: median %v direct, %v through the proxy with %v each way; fastest %v direct, %v through the proxy",
		median(direct), median(proxied), latency, direct[0], proxied[0])
	// Every round trip through the proxy waits out its latency both ways,
	// whatever the machine's load: so does the fastest.
	if proxied[0] < 2*latency {
		t.Fatalf("the fastest round trip through the proxy took %v, want at least %v", proxied[0], 2*latency)
	}
	if extra := proxied[0] - direct[0]; extra > 2*latency+4*time.Millisecond {
		t.Fatalf("the proxy added %v to the fastest round trip, want about %v", extra, 2*latency)
	}
}

// TestPgxlockImpl checks the pgxlock implementation: fn runs in the lock's
// transaction, holding the lock, the commit releases it and the pool's
// connection is idle again; and the counter counts the statements of its
// polling attempt that ran: the lock statement and BEGIN, then COMMIT.
func TestPgxlockImpl(t *testing.T) {
	url := pgtest.Postgres(t)
	ctx := context.Background()
	e := testEnv(t, url)
	im := pgxlockImpl("pgxlock")
	const id = 43
	var n, pid int
	granted := 0
	before := e.stmts.n.Load()
	if err := im.run(ctx, e, id, heldLocks(&n, &pid), func() { granted++ }); err != nil {
		t.Fatal(err)
	}
	if stmts := e.stmts.n.Load() - before; stmts != 3 {
		t.Errorf("counted %d statements, want 3 (BEGIN, the lock statement, COMMIT)", stmts)
	}
	if granted != 1 || n != 1 {
		t.Fatalf("granted %d times, fn's backend held %d advisory locks; want 1 and 1", granted, n)
	}
	if p, status := connState(t, e, im); p != pid || status != 'I' {
		t.Fatalf("after commit: backend %d in state %c, want %d idle", p, status, pid)
	}
	var left int
	if err := e.pgx.QueryRow(ctx, `SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND objid::bigint = ($1::bigint & 4294967295) AND classid::bigint = ($1::bigint >> 32 & 4294967295)`, lockInt64(id)).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Fatalf("%d advisory locks on the key after commit, want 0", left)
	}

	// A busy attempt: its lock statement answers with no row, and the
	// transaction is rolled back.
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	holder, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = holder.Rollback(ctx) }()
	if _, err := holder.Exec(ctx, "SELECT pg_catalog.pg_advisory_xact_lock("+lockArgs(id)+")"); err != nil {
		t.Fatal(err)
	}
	before = e.stmts.n.Load()
	ok, err := pgxlock.TryWithLock(ctx, e.pgx, lockKey(id), func(context.Context, pgx.Tx) error { return nil })
	if err != nil || ok {
		t.Fatalf("with the lock held elsewhere: acquired %v, err %v; want false, nil", ok, err)
	}
	if stmts := e.stmts.n.Load() - before; stmts != 3 {
		t.Errorf("a busy attempt counted %d statements, want 3 (BEGIN, the lock statement, ROLLBACK)", stmts)
	}
	if p, status := connState(t, e, im); p != pid || status != 'I' {
		t.Fatalf("after a busy attempt: backend %d in state %c, want %d idle", p, status, pid)
	}
}

func TestCountStatements(t *testing.T) {
	for _, c := range []struct {
		query string
		want  int
	}{
		{"", 0},
		{"BEGIN", 1},
		{"COMMIT;", 1},
		{" ; ", 0},
		{"SELECT 1; BEGIN", 2},
		{"SELECT 1 WHERE CASE WHEN x THEN CAST(pg_catalog.set_config('a', 'b; c', true) AS integer) IS NULL END; BEGIN", 2},
		{"SELECT 'it''s; one'", 1},
		{`SELECT 1 AS "a;b"; SELECT 2`, 2},
		{"/* a; b */ SELECT 1 -- c; d\n; SELECT 2", 2},
		{"BEGIN; " + bareLock(1), 2},
		{"DO $txlock$BEGIN PERFORM 1; PERFORM 2; EXCEPTION WHEN OTHERS THEN NULL; END$txlock$", 1},
		{"DO $$BEGIN PERFORM 1; END$$; SELECT 1", 2},
		{"SELECT $1::int; SELECT $2", 2},
		{"DO $a$ $b$; $b$ ; $a$", 1},
	} {
		if got := countStatements(c.query); got != c.want {
			t.Errorf("countStatements(%q) = %d, want %d", c.query, got, c.want)
		}
	}
}
