package pgxlock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

var uniq = locktest.Uniq

// newPool opens a pgxpool of at most maxConns connections on url, with pgx's
// default_query_exec_mode set to mode ("" for pgx's default), and checks
// when the test ends that no connection is left acquired.
func newPool(t testing.TB, url, mode string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	if mode != "" {
		url += "&default_query_exec_mode=" + mode
	}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.MaxConns = maxConns
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 5*time.Second, 10*time.Millisecond,
			"connections still acquired: %d", pool.Stat().AcquiredConns())
		pool.Close()
	})
	return pool
}

// direct returns a pool on the test PostgreSQL and the database/sql pool the
// checks use, and checks after the test that no advisory lock is left.
func direct(t testing.TB) (*pgxpool.Pool, *sql.DB) {
	t.Helper()
	url := pgtest.Postgres(t)
	admin := locktest.Open(t, url, 10)
	t.Cleanup(func() { requireNoAdvisoryLocks(t, admin) })
	return newPool(t, url, "", 20), admin
}

// bouncer returns a pool through the test PgBouncer in mode, and the admin
// console's URL.
func bouncer(t testing.TB, mode string) (*pgxpool.Pool, *sql.DB, string) {
	t.Helper()
	url, adminURL := pgtest.PgBouncer(t)
	_, admin := direct(t)
	return newPool(t, url, mode, 20), admin, adminURL
}

var requireNoAdvisoryLocks = locktest.RequireNoAdvisoryLocks

// ledger is locktest's racy workload, with steps in a pgx.Tx.
type ledger struct{ *locktest.Ledger }

func newLedger(t *testing.T, db *sql.DB) ledger {
	return ledger{locktest.NewLedger(t, db, "pgxledger")}
}

func (l ledger) step(ctx context.Context, tx pgx.Tx) error { return l.Step(ctx, pgxTx{tx}) }

func (l ledger) check(t *testing.T, db *sql.DB) (n, overlaps int) { return l.Check(t, db) }

// pgxTx is a pgx.Tx as a ledger's Tx.
type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) QueryInt(ctx context.Context, query string, args ...any) (int, error) {
	var n int
	err := t.tx.QueryRow(ctx, query, args...).Scan(&n)
	return n, err
}

func (t pgxTx) Exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.Exec(ctx, query, args...)
	return err
}

// stepNoArgs is step with statements that take no arguments, which pgx
// sends with the simple protocol in every exec mode.
func (l ledger) stepNoArgs(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, `INSERT INTO `+l.Table+`_runs (enter, exit) VALUES (clock_timestamp(), NULL);
		UPDATE `+l.Table+`_counter SET n = n + 1;
		SELECT pg_sleep(0.002);
		UPDATE `+l.Table+`_runs SET exit = clock_timestamp() WHERE exit IS NULL`)
	return err
}

var hammer = locktest.Hammer

func TestMutualExclusion(t *testing.T) {
	const workers, iters = 8, 8
	for _, tc := range []struct {
		name   string
		mode   string
		bounce bool
		noArgs bool // fn's own statements take no arguments
	}{
		{name: "direct"},
		{name: "direct/simple_protocol", mode: "simple_protocol"},
		{name: "pgbouncer/exec", mode: "exec", bounce: true},
		{name: "pgbouncer/simple_protocol", mode: "simple_protocol", bounce: true},
		{name: "pgbouncer/describe_exec", mode: "describe_exec", bounce: true},
		{name: "pgbouncer/cache_describe", mode: "cache_describe", bounce: true},
		// cache_statement prepares named statements, which PgBouncer 1.18
		// in transaction mode mixes up between clients: fn's statements
		// must not use it there, but the lock's own do not need to.
		{name: "pgbouncer/cache_statement", mode: "cache_statement", bounce: true, noArgs: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pool *pgxpool.Pool
			var admin *sql.DB
			if tc.bounce {
				pool, admin, _ = bouncer(t, tc.mode)
			} else {
				pool, admin = direct(t)
				if tc.mode != "" {
					pool = newPool(t, pgtest.Postgres(t), tc.mode, 20)
				}
			}
			l := newLedger(t, admin)
			step := l.step
			if tc.noArgs {
				step = l.stepNoArgs
			}
			key := txlock.StringKey(uniq(t))
			errs := hammer(workers, iters, func() error {
				return pgxlock.WithLock(context.Background(), pool, key, step, txlock.WithTimeout(30*time.Second))
			})
			require.Empty(t, errs)
			n, overlaps := l.check(t, admin)
			assert.Equal(t, workers*iters, n, "lost updates")
			assert.Zero(t, overlaps, "critical sections overlapped")
		})
	}
}

// The same workload without the lock does lose updates: the check above
// can fail.
func TestMutualExclusionControl(t *testing.T) {
	pool, admin := direct(t)
	l := newLedger(t, admin)
	errs := hammer(8, 8, func() error {
		return pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error { return l.step(context.Background(), tx) })
	})
	require.Empty(t, errs)
	n, overlaps := l.check(t, admin)
	assert.Less(t, n, 64, "unlocked workload lost no update")
	assert.NotZero(t, overlaps)
}

// A busy attempt hands its connection back to the pool idle, in no
// transaction, and does not cost the pool the connection: the same backend
// serves the next caller.
func TestBusyAttemptReturnsIdleConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []txlock.Option
	}{
		{"lock first", nil},
		{"begin first", []txlock.Option{txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})}},
		{"server wait", []txlock.Option{txlock.WithServerWait(txlock.ServerWait{Window: 20 * time.Millisecond})}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, admin := direct(t)
			pool := newPool(t, pgtest.Postgres(t), "", 1)
			key := txlock.StringKey(uniq(t))
			locktest.Hold(t, admin, key, false)
			var pid uint32
			require.NoError(t, pool.AcquireFunc(context.Background(), func(c *pgxpool.Conn) error {
				pid = c.Conn().PgConn().PID()
				return nil
			}))
			opts := append([]txlock.Option{txlock.WithTimeout(300 * time.Millisecond)}, tc.opts...)
			err := pgxlock.WithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error { return nil }, opts...)
			require.ErrorIs(t, err, txlock.ErrLockTimeout)
			var te *txlock.LockTimeoutError
			require.ErrorAs(t, err, &te)
			assert.Greater(t, te.Attempts, 1)
			c, err := pool.Acquire(context.Background())
			require.NoError(t, err)
			defer c.Release()
			assert.Equal(t, byte('I'), c.Conn().PgConn().TxStatus(), "the connection came back in a transaction")
			assert.EqualValues(t, 1, pool.Stat().TotalConns())
			assert.Equal(t, pid, c.Conn().PgConn().PID(), "the pool lost its connection")
			var state string
			require.NoError(t, admin.QueryRow(`SELECT state FROM pg_stat_activity WHERE pid = $1`, c.Conn().PgConn().PID()).Scan(&state))
			assert.Equal(t, "idle", state)
		})
	}
}

// A grant costs one round trip before fn: the lock statement and BEGIN are
// one query, whose transaction fn then runs in. pg_stat_activity shows it.
func TestLockRidesInBegin(t *testing.T) {
	pool, _ := direct(t)
	key := txlock.Int64Key(42)
	err := pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		var query, state string
		var held bool
		require.NoError(t, tx.QueryRow(ctx, `SELECT a.state, EXISTS (SELECT FROM pg_locks l WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory' AND l.objid = 42 AND l.granted),
			(SELECT query FROM pg_stat_activity WHERE pid = pg_backend_pid())
			FROM pg_stat_activity a WHERE a.pid = pg_backend_pid()`).Scan(&state, &held, &query))
		assert.True(t, held)
		assert.Equal(t, "active", state)
		lock, ok := txlock.LockFromContext(ctx)
		require.True(t, ok)
		assert.Equal(t, 1, lock.Attempts)
		assert.True(t, txlock.Held(ctx))
		return nil
	})
	require.NoError(t, err)
}

func TestLockTimeout(t *testing.T) {
	pool, admin := direct(t)
	key := txlock.StringKey(uniq(t))
	locktest.Hold(t, admin, key, false)
	called := false
	start := time.Now()
	err := pgxlock.WithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error {
		called = true
		return nil
	}, txlock.WithTimeout(time.Second))
	require.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.False(t, called)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "the timeout option, not the context, ran out")
	var te *txlock.LockTimeoutError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, []txlock.Key{key}, te.Keys)
	assert.Greater(t, te.Attempts, 2)
	assert.GreaterOrEqual(t, te.Waited, time.Second)
	assert.Less(t, time.Since(start), 3*time.Second)

	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = pgxlock.WithLock(ctx, pool, key, func(context.Context, pgx.Tx) error { return nil })
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestCancelWhileWaiting(t *testing.T) {
	pool, admin := direct(t)
	key := txlock.StringKey(uniq(t))
	locktest.Hold(t, admin, key, false)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	var kind txlock.EventKind
	last := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context { kind = e.Kind; return ctx })
	err := pgxlock.WithLock(ctx, pool, key, func(context.Context, pgx.Tx) error { return nil }, txlock.WithTimeout(time.Minute), txlock.WithObserver(last))
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout, "a cancellation is not a timeout")
	assert.Equal(t, txlock.Canceled, kind)
	assert.Less(t, time.Since(start), 2*time.Second)
}

func TestTryWithLock(t *testing.T) {
	pool, admin := direct(t)
	key := txlock.StringKey(uniq(t))
	release := locktest.Hold(t, admin, key, false)
	called := false
	ok, err := pgxlock.TryWithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error {
		called = true
		return nil
	})
	require.NoError(t, err)
	assert.False(t, ok)
	assert.False(t, called)
	release()
	ok, err = pgxlock.TryWithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error {
		called = true
		return nil
	})
	require.NoError(t, err)
	assert.True(t, ok)
	assert.True(t, called)
}

func TestSharedAndExclusive(t *testing.T) {
	pool, admin := direct(t)
	key := txlock.StringKey(uniq(t))
	release := locktest.Hold(t, admin, key, true)
	// Another shared holder gets in; an exclusive one does not.
	ok, err := pgxlock.TryWithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error { return nil }, txlock.WithShared())
	require.NoError(t, err)
	assert.True(t, ok)
	ok, err = pgxlock.TryWithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error { return nil })
	require.NoError(t, err)
	assert.False(t, ok)
	release()
	locktest.Hold(t, admin, key, false)
	ok, err = pgxlock.TryWithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error { return nil }, txlock.WithShared())
	require.NoError(t, err)
	assert.False(t, ok)
}

func TestMultiKeyAllOrNothing(t *testing.T) {
	pool, admin := direct(t)
	a, b := txlock.StringKey(uniq(t)), txlock.StringKey(uniq(t))
	release := locktest.Hold(t, admin, b, false)
	ok, err := pgxlock.TryWithLocks(context.Background(), pool, []txlock.Key{a, b}, func(context.Context, pgx.Tx) error { return nil })
	require.NoError(t, err)
	assert.False(t, ok)
	// The partial grant of a was rolled back with the attempt.
	ok, err = txlock.TryWithLock(context.Background(), admin, a, func(context.Context, *sql.Tx) error { return nil })
	require.NoError(t, err)
	assert.True(t, ok, "a was left locked by the failed attempt")
	release()
	err = pgxlock.WithLocks(context.Background(), pool, []txlock.Key{b, a, b}, func(ctx context.Context, tx pgx.Tx) error {
		lock, _ := txlock.LockFromContext(ctx)
		assert.Len(t, lock.Keys, 2)
		var n int
		require.NoError(t, tx.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' AND granted`).Scan(&n))
		assert.Equal(t, 2, n)
		return nil
	})
	require.NoError(t, err)
}

func TestFnPaths(t *testing.T) {
	pool, admin := direct(t)
	table := fmt.Sprintf("pgxfn_%d", time.Now().UnixNano())
	_, err := admin.Exec(`CREATE TABLE ` + table + ` (v text)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(`DROP TABLE ` + table) })
	count := func(v string) int {
		var n int
		require.NoError(t, admin.QueryRow(`SELECT count(*) FROM `+table+` WHERE v = $1`, v).Scan(&n))
		return n
	}
	insert := func(v string) func(ctx context.Context, tx pgx.Tx) error {
		return func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` VALUES ($1)`, v)
			return err
		}
	}
	key := txlock.StringKey(uniq(t))

	require.NoError(t, pgxlock.WithLock(context.Background(), pool, key, insert("commit")))
	assert.Equal(t, 1, count("commit"))

	boom := errors.New("boom")
	err = pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		require.NoError(t, insert("rollback")(ctx, tx))
		return boom
	})
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, count("rollback"))

	assert.PanicsWithValue(t, "fn panic", func() {
		_ = pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
			require.NoError(t, insert("panic")(ctx, tx))
			panic("fn panic")
		})
	})
	assert.Zero(t, count("panic"))

	// fn ends the transaction itself.
	err = pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		return tx.Commit(ctx)
	})
	assert.ErrorIs(t, err, txlock.ErrFnEndedTx)

	// A statement of fn failed and fn returned nil: COMMIT rolls back.
	err = pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		require.NoError(t, insert("aborted")(ctx, tx))
		_, _ = tx.Exec(ctx, `SELECT 1/0`)
		return nil
	})
	assert.ErrorIs(t, err, txlock.ErrCommitFailed)
	assert.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	assert.Zero(t, count("aborted"))

	// A savepoint inside fn, as pgx does it.
	err = pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		nested, err := tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, insert("nested")(ctx, nested))
		require.NoError(t, nested.Rollback(ctx))
		return insert("outer")(ctx, tx)
	})
	require.NoError(t, err)
	assert.Zero(t, count("nested"))
	assert.Equal(t, 1, count("outer"))

	// fn's context ends with the caller's: fn's statements fail, and the
	// transaction rolls back.
	ctx, cancel := context.WithCancel(context.Background())
	err = pgxlock.WithLock(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) error {
		cancel()
		return nil
	})
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, txlock.ErrCommitFailed)
}

func TestMaxHold(t *testing.T) {
	pool, _ := direct(t)
	key := txlock.StringKey(uniq(t))
	// fn outlives the bound while idle: its context ends, its next
	// statement fails, and the lock ends with ErrHoldTimeout.
	start := time.Now()
	err := pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		<-ctx.Done()
		assert.ErrorIs(t, context.Cause(ctx), txlock.ErrHoldTimeout)
		_, err := tx.Exec(ctx, `SELECT 1`)
		return err
	}, txlock.WithMaxHold(300*time.Millisecond))
	assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
	assert.GreaterOrEqual(t, time.Since(start), 300*time.Millisecond)

	// The server's side of the bound ends a fn that sends nothing and
	// does not return: idle_in_transaction_session_timeout ends the
	// session, and the lock with it, while fn still runs.
	admin := locktest.Open(t, pgtest.Postgres(t), 2)
	freed := make(chan time.Duration, 1)
	err = pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		begin := time.Now()
		require.Eventually(t, func() bool {
			ok, err := txlock.TryWithLock(context.Background(), admin, key, func(context.Context, *sql.Tx) error { return nil })
			return err == nil && ok
		}, 10*time.Second, 20*time.Millisecond, "the server did not end the frozen holder's session")
		freed <- time.Since(begin)
		return nil
	}, txlock.WithMaxHold(500*time.Millisecond))
	assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
	assert.GreaterOrEqual(t, <-freed, 400*time.Millisecond)

	// A fn within the bound commits.
	require.NoError(t, pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `SELECT pg_sleep(0.05)`)
		return err
	}, txlock.WithMaxHold(1500*time.Millisecond)))
}

func TestStandbyRefused(t *testing.T) {
	pool := newPool(t, pgtest.Standby(t), "", 4)
	key := txlock.StringKey(uniq(t))
	for name, opts := range map[string][]txlock.Option{
		"lock first":  nil,
		"begin first": {txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})},
		"hold bound":  {txlock.WithMaxHold(time.Second)},
		"server wait": {txlock.WithServerWait(txlock.ServerWait{})},
	} {
		t.Run(name, func(t *testing.T) {
			called := false
			err := pgxlock.WithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error {
				called = true
				return nil
			}, opts...)
			assert.ErrorIs(t, err, txlock.ErrStandby)
			assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
			assert.False(t, called)
		})
	}
	ok, err := pgxlock.TryWithLocks(context.Background(), pool, []txlock.Key{key, txlock.StringKey(uniq(t))}, func(context.Context, pgx.Tx) error { return nil })
	assert.ErrorIs(t, err, txlock.ErrStandby)
	assert.False(t, ok)
	err = pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := pgxlock.TryLockTx(context.Background(), tx, key)
		assert.ErrorIs(t, err, txlock.ErrStandby)
		_, err = tx.Exec(context.Background(), `SELECT 1`)
		return err
	})
	assert.NoError(t, err, "the caller's transaction is still usable")
	c, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer c.Release()
	assert.Equal(t, byte('I'), c.Conn().PgConn().TxStatus())
}

// Under REPEATABLE READ and SERIALIZABLE a racy read-modify-write loses
// nothing: a stale snapshot fails with 40001, and fn runs again.
func TestSerializationRetries(t *testing.T) {
	for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		t.Run(level.String(), func(t *testing.T) {
			pool, admin := direct(t)
			l := newLedger(t, admin)
			key := txlock.StringKey(uniq(t))
			var levels sync.Map
			errs := hammer(6, 6, func() error {
				return pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
					var got string
					if err := tx.QueryRow(ctx, `SHOW transaction_isolation`).Scan(&got); err != nil {
						return err
					}
					levels.Store(got, true)
					return l.step(ctx, tx)
				}, txlock.WithTxOptions(&sql.TxOptions{Isolation: level}), txlock.WithSerializationRetries(20), txlock.WithTimeout(30*time.Second))
			})
			require.Empty(t, errs)
			n, _ := l.check(t, admin)
			assert.Equal(t, 36, n)
			_, ok := levels.Load(map[sql.IsolationLevel]string{sql.LevelRepeatableRead: "repeatable read", sql.LevelSerializable: "serializable"}[level])
			assert.True(t, ok)
		})
	}
}

func TestLockTx(t *testing.T) {
	for _, mode := range []string{"", "exec", "simple_protocol"} {
		t.Run("mode="+mode, func(t *testing.T) {
			_, admin := direct(t)
			pool := newPool(t, pgtest.Postgres(t), mode, 4)
			key := txlock.StringKey(uniq(t))
			err := pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
				require.NoError(t, pgxlock.LockTx(context.Background(), tx, key))
				ok, err := txlock.TryWithLock(context.Background(), admin, key, func(context.Context, *sql.Tx) error { return nil })
				require.NoError(t, err)
				assert.False(t, ok, "the lock was not held in the caller's transaction")
				return nil
			})
			require.NoError(t, err)
			release := locktest.Hold(t, admin, key, false)
			err = pgx.BeginFunc(context.Background(), pool, func(tx pgx.Tx) error {
				ok, err := pgxlock.TryLockTx(context.Background(), tx, key)
				require.NoError(t, err)
				assert.False(t, ok)
				err = pgxlock.LockTx(context.Background(), tx, key, txlock.WithServerWait(txlock.ServerWait{Window: 50 * time.Millisecond}), txlock.WithTimeout(200*time.Millisecond))
				assert.ErrorIs(t, err, txlock.ErrLockTimeout)
				_, err = tx.Exec(context.Background(), `SELECT 1`)
				return err // the caller's transaction is still usable
			})
			require.NoError(t, err)
			release()
		})
	}
	err := pgxlock.LockTx(context.Background(), nil, txlock.Int64Key(1))
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
}

func TestFailOpen(t *testing.T) {
	pool, admin := direct(t)
	key := txlock.StringKey(uniq(t))
	locktest.Hold(t, admin, key, false)
	ran := false
	err := pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		ran = true
		lock, ok := txlock.LockFromContext(ctx)
		assert.True(t, ok)
		assert.False(t, lock.Held)
		assert.False(t, txlock.Held(ctx))
		_, err := txlock.FenceToken(ctx)
		assert.ErrorIs(t, err, txlock.ErrNoToken)
		_, err = tx.Exec(ctx, `SELECT 1`)
		return err
	}, txlock.WithTimeout(200*time.Millisecond), txlock.WithFailOpen(nil))
	require.NoError(t, err)
	assert.True(t, ran)
}

func TestFenceToken(t *testing.T) {
	for _, mode := range []string{"", "cache_statement"} {
		t.Run("mode="+mode, func(t *testing.T) {
			url, _ := pgtest.PgBouncer(t)
			_, admin := direct(t)
			require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
			pool := newPool(t, url, mode, 4)
			key := txlock.StringKey(uniq(t))
			var last int64
			for range 3 {
				require.NoError(t, pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
					tok, err := txlock.FenceToken(ctx)
					require.NoError(t, err)
					again, err := txlock.FenceToken(ctx)
					require.NoError(t, err)
					assert.Equal(t, tok, again)
					assert.Greater(t, tok, last)
					last = tok
					return nil
				}))
			}
		})
	}
	// One connection: no second one to draw on.
	_, admin := direct(t)
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
	one := newPool(t, pgtest.Postgres(t), "", 1)
	conn, err := pgx.Connect(context.Background(), pgtest.Postgres(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	t.Run("pool of one", func(t *testing.T) { noToken(t, one) })
	t.Run("conn", func(t *testing.T) { noToken(t, conn) })
}

// noToken checks that a fn on db, which has no second connection, gets
// ErrNoToken from FenceToken.
func noToken[D pgxlock.DB](t *testing.T, db D) {
	require.NoError(t, pgxlock.WithLock(context.Background(), db, txlock.StringKey(uniq(t)), func(ctx context.Context, tx pgx.Tx) error {
		_, err := txlock.FenceToken(ctx)
		assert.ErrorIs(t, err, txlock.ErrNoToken)
		return nil
	}))
}

// A *pgx.Conn and a *pgxpool.Conn take the lock on themselves.
func TestSingleConnections(t *testing.T) {
	pool, admin := direct(t)
	conn, err := pgx.Connect(context.Background(), pgtest.Postgres(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	pc, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer pc.Release()
	t.Run("pgx.Conn", func(t *testing.T) { locksOnItself(t, conn, admin) })
	t.Run("pgxpool.Conn", func(t *testing.T) { locksOnItself(t, pc, admin) })
	assert.Equal(t, byte('I'), conn.PgConn().TxStatus())
}

// locksOnItself checks that a call on the connection db holds the lock
// against admin's sessions, and that a try on it sees admin's lock.
func locksOnItself[D pgxlock.DB](t *testing.T, db D, admin *sql.DB) {
	key := txlock.StringKey(uniq(t))
	require.NoError(t, pgxlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx pgx.Tx) error {
		ok, err := txlock.TryWithLock(context.Background(), admin, key, func(context.Context, *sql.Tx) error { return nil })
		require.NoError(t, err)
		assert.False(t, ok)
		return nil
	}))
	release := locktest.Hold(t, admin, key, false)
	ok, err := pgxlock.TryWithLock(context.Background(), db, key, func(context.Context, pgx.Tx) error { return nil })
	require.NoError(t, err)
	assert.False(t, ok)
	release()
}

// The call's events are txlock's.
func TestObserver(t *testing.T) {
	pool, admin := direct(t)
	key := txlock.StringKey(uniq(t))
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
	var kinds []txlock.EventKind
	var mu sync.Mutex
	obs := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
		return ctx
	})
	release := locktest.Hold(t, admin, key, false)
	var busy atomic.Int32
	go func() {
		require.Eventually(t, func() bool { return busy.Load() > 0 }, 5*time.Second, time.Millisecond)
		release()
	}()
	obsBusy := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		if e.Kind == txlock.Busy {
			busy.Add(1)
		}
		return obs(ctx, e)
	})
	require.NoError(t, pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
		_, err := txlock.FenceToken(ctx)
		return err
	}, txlock.WithObserver(obsBusy)))
	mu.Lock()
	defer mu.Unlock()
	require.GreaterOrEqual(t, len(kinds), 5)
	assert.Equal(t, txlock.WaitStarted, kinds[0])
	assert.Equal(t, txlock.Busy, kinds[1])
	assert.Equal(t, []txlock.EventKind{txlock.Acquired, txlock.TokenIssued, txlock.Released}, kinds[len(kinds)-3:])
}

func TestBadInput(t *testing.T) {
	pool, _ := direct(t)
	fn := func(context.Context, pgx.Tx) error { return nil }
	var nilPool *pgxpool.Pool
	for name, err := range map[string]error{
		"nil pool":   pgxlock.WithLock(context.Background(), nilPool, txlock.Int64Key(1), fn),
		"nil fn":     pgxlock.WithLock(context.Background(), pool, txlock.Int64Key(1), nil),
		"zero key":   pgxlock.WithLock(context.Background(), pool, txlock.Key{}, fn),
		"no keys":    pgxlock.WithLocks(context.Background(), pool, nil, fn),
		"bad option": pgxlock.WithLock(context.Background(), pool, txlock.Int64Key(1), fn, txlock.WithTimeout(-1)),
		"bad level":  pgxlock.WithLock(context.Background(), pool, txlock.Int64Key(1), fn, txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelSnapshot})),
	} {
		t.Run(name, func(t *testing.T) {
			require.Error(t, err)
			assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
		})
	}
}

// DB's set of types is closed at compile time: a wrapper of a pool that has
// a BeginTx method of its own, which pgxlock could not drive, does not
// compile as a DB, where it used to compile and then fail at run time. The
// wrapper in testdata passes the pool it wraps instead, which compiles.
func TestDBIsClosed(t *testing.T) {
	build := func(tags string) (string, error) {
		cmd := exec.Command("go", "build", "-tags", tags, "-o", os.DevNull, "./testdata/wrapper")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := build("wrapper_as_db")
	require.Error(t, err, "a wrapper type compiled as a pgxlock.DB")
	assert.Contains(t, out, "does not satisfy pgxlock.DB", out)
	out, err = build("")
	require.NoError(t, err, "the wrapper's own pool did not compile as a pgxlock.DB: %s", out)
}

// Waiters pin no server connection through PgBouncer: 20 waiters in 2
// pools (2 processes, in effect) behind a held lock, on 5 server
// connections. Only the holder and each pool's queue head, whose windows
// wait in the server one after the other, are linked to a server
// connection in every sample, an unrelated client always gets through, and
// at most one backend per pool waits on the lock.
func TestWaitersHoldNoServerConnection(t *testing.T) {
	url, adminURL := pgtest.PgBouncer(t)
	_, directDB := direct(t)
	console, err := sql.Open("pgx", adminURL)
	require.NoError(t, err)
	defer console.Close()
	key := txlock.StringKey(uniq(t))
	pools := make([]*pgxpool.Pool, 2)
	for i := range pools {
		pools[i] = newPool(t, url, "exec", 5)
	}
	holder, err := pools[0].Begin(context.Background())
	require.NoError(t, err)
	_, err = holder.Exec(context.Background(), "SELECT pg_advisory_xact_lock("+locktest.LockArgs(key)+")")
	require.NoError(t, err)

	const waiters = 20
	var granted atomic.Int32
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			assert.NoError(t, pgxlock.WithLock(context.Background(), pools[i%len(pools)], key, func(context.Context, pgx.Tx) error {
				granted.Add(1)
				return nil
			}, txlock.WithTimeout(30*time.Second)))
		})
	}
	time.Sleep(300 * time.Millisecond)
	const samples = 20
	linked := map[string]int{}
	var longest float64 // seconds of a backend's wait on the lock, over the samples
	for range samples {
		for c := range linkedClients(t, console) {
			linked[c]++
		}
		var s float64
		require.NoError(t, directDB.QueryRow(`SELECT coalesce(max(extract(epoch FROM now() - query_start)), 0)::float8
			FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&s))
		longest = max(longest, s)
		qctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var one int
		require.NoError(t, pools[1].QueryRow(qctx, "SELECT 1").Scan(&one), "an unrelated client could not get a server connection")
		cancel()
		time.Sleep(25 * time.Millisecond)
	}
	always := 0
	for _, n := range linked {
		if n == samples {
			always++
		}
	}
	t.Logf("%d waiters in %d pools on 5 server connections: %d clients seen linked, %d linked in all %d samples", waiters, len(pools), len(linked), always, samples)
	assert.LessOrEqual(t, always, 1+len(pools), "only the holder and the queue heads may keep a server connection")
	assert.Zero(t, granted.Load())
	var blocked int
	require.NoError(t, directDB.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&blocked))
	assert.LessOrEqual(t, blocked, len(pools), "only each pool's queue head waits in the server")
	// The default's window is 200ms; the samples span more than 500ms
	// after the waiters began, so a wait without end would be seen past it.
	assert.Less(t, longest, 0.5, "the heads' waits in the server are windows, not one wait without end")
	require.NoError(t, holder.Rollback(context.Background()))
	wg.Wait()
	assert.Equal(t, int32(waiters), granted.Load())
}

// linkedClients returns the clients that PgBouncer has linked to a server
// connection.
func linkedClients(t *testing.T, console *sql.DB) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, row := range locktest.Rows(t, console, "SHOW CLIENTS") {
		if row["database"] == "postgres" && row["link"] != "" {
			out[row["addr"]+":"+row["port"]] = true
		}
	}
	return out
}

// A goroutine fn started may draw a fencing token while fn returns: the
// token's confirmation on the lock's connection finishes before the commit,
// and none starts after it (a pgx connection serves one statement at a
// time). Under -race this found the commit and a confirmation on the same
// connection at once.
func TestTokenRacesFnReturn(t *testing.T) {
	pool, admin := direct(t)
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
	key := txlock.StringKey(uniq(t))
	var drawn, refused atomic.Int32
	for range 50 {
		var wg sync.WaitGroup
		require.NoError(t, pgxlock.WithLock(context.Background(), pool, key, func(ctx context.Context, tx pgx.Tx) error {
			wg.Go(func() {
				for {
					_, err := txlock.FenceToken(ctx)
					if err != nil {
						assert.ErrorIs(t, err, txlock.ErrNoToken)
						refused.Add(1)
						return
					}
					drawn.Add(1)
				}
			})
			time.Sleep(time.Millisecond)
			return nil
		}))
		wg.Wait()
	}
	t.Logf("%d tokens returned to goroutines of fn, %d refused once fn had returned", drawn.Load(), refused.Load())
	assert.EqualValues(t, 50, refused.Load())
}

// A wait that ends while its last ServerWait window, or an attempt that
// began with BEGIN, is in the server leaves a caller's connection open and
// in no transaction: the window ends in lock_timeout before the deadline,
// and the rollbacks have a context of their own. So it does when the
// caller's context ends first (ctx), and across a network (network), whose
// answer comes after the deadline, within driver.StallGrace. A pause of
// the machine longer than the window's margin (25ms) can still let the
// deadline end a statement, which closes the connection (a loaded CI run
// lost 1 of 5 in the ctx case), so up to 2 of 5 may be lost, and the next
// call reconnects. With the margin at 0 the ctx case lost 1 of 5 here:
// what the test catches is a window not cut before the context's deadline,
// with which every such call lost its connection (the CHANGELOG's 6 of 6).
func TestTimeoutKeepsCallersConnection(t *testing.T) {
	_, admin := direct(t)
	key := txlock.StringKey(uniq(t))
	locktest.Hold(t, admin, key, false)
	serverWait := txlock.WithServerWait(txlock.ServerWait{Window: 50 * time.Millisecond})
	for _, tc := range []struct {
		name        string
		opt         txlock.Option
		latency     time.Duration
		ctxDeadline bool
	}{
		{name: "server wait", opt: serverWait},
		{name: "begin first", opt: txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelSerializable})},
		{name: "server wait/ctx", opt: txlock.WithServerWait(txlock.ServerWait{}), ctxDeadline: true},
		{name: "server wait/network", opt: txlock.WithServerWait(txlock.ServerWait{}), latency: 30 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := pgtest.Postgres(t)
			if tc.latency > 0 {
				url = pgtest.Delayed(t, url, tc.latency)
			}
			conn, err := pgx.Connect(context.Background(), url)
			require.NoError(t, err)
			defer func() { conn.Close(context.Background()) }()
			var lost []time.Duration
			for i := range 5 {
				timeout := time.Duration(150+i*70) * time.Millisecond
				ctx, opts := context.Background(), []txlock.Option{tc.opt, txlock.WithTimeout(timeout)}
				if tc.ctxDeadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, timeout)
					defer cancel()
					opts[1] = txlock.WithTimeout(time.Minute)
				}
				err := pgxlock.WithLock(ctx, conn, key, func(context.Context, pgx.Tx) error { return nil }, opts...)
				if tc.ctxDeadline {
					require.ErrorIs(t, err, context.DeadlineExceeded)
				} else {
					require.ErrorIs(t, err, txlock.ErrLockTimeout)
				}
				if conn.IsClosed() {
					lost = append(lost, timeout)
					conn, err = pgx.Connect(context.Background(), url)
					require.NoError(t, err)
					continue
				}
				require.Equal(t, byte('I'), conn.PgConn().TxStatus())
			}
			t.Logf("calls whose connection was closed, by timeout: %v", lost)
			assert.LessOrEqual(t, len(lost), 2, "the caller's connection was closed: %v", lost)
		})
	}
}

// The hold bound counts from the grant, as the server's does: an Observer
// that takes its time over Acquired spends the bound, and a fn that then
// returns nil late gets ErrHoldTimeout, not a commit failure.
func TestMaxHoldCountsFromGrant(t *testing.T) {
	pool, _ := direct(t)
	obs := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		if e.Kind == txlock.Acquired {
			time.Sleep(250 * time.Millisecond)
		}
		return ctx
	})
	err := pgxlock.WithLock(context.Background(), pool, txlock.StringKey(uniq(t)), func(ctx context.Context, tx pgx.Tx) error {
		time.Sleep(200 * time.Millisecond)
		return nil
	}, txlock.WithMaxHold(300*time.Millisecond), txlock.WithObserver(obs))
	assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
}

// A connection already in a transaction is refused: a busy attempt would
// abort the caller's transaction, and a grant would commit it.
func TestConnInTransactionRefused(t *testing.T) {
	direct(t)
	conn, err := pgx.Connect(context.Background(), pgtest.Postgres(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	tx, err := conn.Begin(context.Background())
	require.NoError(t, err)
	defer tx.Rollback(context.Background())
	ran := false
	err = pgxlock.WithLock(context.Background(), conn, txlock.StringKey(uniq(t)), func(context.Context, pgx.Tx) error {
		ran = true
		return nil
	})
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "LockTx")
	assert.False(t, ran)
}

// drawer takes a key on pool for the draw tests, with WithFencing if asked.
func drawer(pool *pgxpool.Pool) locktest.Drawer {
	return func(ctx context.Context, key txlock.Key, fencing bool, body func(context.Context) error) error {
		var opts []txlock.Option
		if fencing {
			opts = append(opts, txlock.WithFencing())
		}
		return pgxlock.WithLock(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) error { return body(ctx) }, opts...)
	}
}

// The connection WithFencing sets aside keeps its server connection
// through PgBouncer while holders keep all the others, and holds nothing
// there (locktest.PinnedDraws), in the exec modes that name their
// statements and that do not.
func TestDrawConnectionKeepsItsServer(t *testing.T) {
	_, admin := direct(t)
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
	t.Run("direct", func(t *testing.T) {
		locktest.PinnedDraws(t, admin, 0, drawer(newPool(t, pgtest.Postgres(t), "", 8)))
	})
	for _, mode := range []string{"cache_statement", "exec"} {
		t.Run("pgbouncer/"+mode, func(t *testing.T) {
			url, adminURL := pgtest.PgBouncer(t)
			locktest.PinnedDraws(t, admin, locktest.BouncerPoolSize(t, adminURL), drawer(newPool(t, url, mode, 8)))
		})
	}
}

// N holders on a pool of N connections that all draw tokens all succeed
// with WithFencing, directly and through PgBouncer; without it, holders that
// fill the pool and then draw fail at once with ErrNoToken, which names
// WithFencing, instead of waiting for a connection none of them gives back.
func TestHoldersDrawOnTheirOwnPool(t *testing.T) {
	const iters = 50
	for _, route := range []string{"direct", "pgbouncer"} {
		t.Run(route, func(t *testing.T) {
			url, n := pgtest.Postgres(t), int32(4)
			if route == "pgbouncer" {
				var admin string
				url, admin = pgtest.PgBouncer(t)
				// More holders than PgBouncer has server connections:
				// the draw connection keeps one of them.
				n = int32(locktest.BouncerPoolSize(t, admin) + 2)
			}
			_, admin := direct(t)
			require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
			t.Run("WithFencing", func(t *testing.T) {
				require.Empty(t, locktest.DrawingHolders(t, int(n), iters, drawer(newPool(t, url, "", n))))
			})
			// Without WithFencing, holders that fill the pool: at most as
			// many as PgBouncer's server connections, which they all keep.
			t.Run("without", func(t *testing.T) { locktest.FullPoolDraws(t, 4, drawer(newPool(t, url, "", 4))) })
		})
	}
	conn, err := pgx.Connect(context.Background(), pgtest.Postgres(t))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	err = pgxlock.WithLock(context.Background(), conn, txlock.StringKey(uniq(t)), func(context.Context, pgx.Tx) error { return nil }, txlock.WithFencing())
	require.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "single connection")
}

// A try whose one attempt cannot get a connection before its timeout ends
// as a wait does (see txlock.LockTimeoutError): at WithTimeout or the
// context's deadline, a timeout, and not context.Canceled; when the context
// is cancelled, a cancellation. Here the pool's one connection is in use.
func TestTryTimesOutWaitingForConnection(t *testing.T) {
	pool := newPool(t, pgtest.Postgres(t), "", 1)
	c, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	defer c.Release()
	fn := func(context.Context, pgx.Tx) error { t.Error("fn ran"); return nil }

	ok, err := pgxlock.TryWithLock(context.Background(), pool, txlock.StringKey(uniq(t)), fn, txlock.WithTimeout(200*time.Millisecond))
	assert.False(t, ok)
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.NotErrorIs(t, err, context.Canceled)

	dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer dcancel()
	ok, err = pgxlock.TryWithLock(dctx, pool, txlock.StringKey(uniq(t)), fn)
	assert.False(t, ok)
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, ccancel)
	ok, err = pgxlock.TryWithLock(cctx, pool, txlock.StringKey(uniq(t)), fn)
	assert.False(t, ok)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
}

// TestMaxHoldEndsCommitWithoutStandby: a bound that ends a COMMIT waiting
// for a synchronous standby reports the outcome unknown (locktest's scene).
func TestMaxHoldEndsCommitWithoutStandby(t *testing.T) {
	locktest.CommitWithoutStandby(t, func(ctx context.Context, url string, key txlock.Key, stmt string, opts ...txlock.Option) error {
		return pgxlock.WithLock(ctx, newPool(t, url, "", 4), key, func(ctx context.Context, tx pgx.Tx) error {
			_, err := tx.Exec(ctx, stmt)
			return err
		}, opts...)
	})
}
