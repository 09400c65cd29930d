package txlock_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// ledger is locktest's racy workload, with steps in a *sql.Tx.
type ledger struct{ *locktest.Ledger }

func newLedger(t *testing.T, db *sql.DB) ledger { return ledger{locktest.NewLedger(t, db, "ledger")} }

func (l ledger) step(ctx context.Context, tx *sql.Tx) error {
	return l.Step(ctx, locktest.SQLTx{Tx: tx})
}

func (l ledger) check(t *testing.T, db *sql.DB) (n, overlaps int) { return l.Check(t, db) }

func TestMutualExclusion(t *testing.T) {
	const workers, iters = 8, 8
	for _, tc := range []struct {
		name string
		db   func(t testing.TB) *sql.DB
	}{
		{"direct", direct},
		{"pgbouncer/exec", func(t testing.TB) *sql.DB { db, _ := bouncer(t, "exec"); return db }},
		{"pgbouncer/simple_protocol", func(t testing.TB) *sql.DB { db, _ := bouncer(t, "simple_protocol"); return db }},
		{"pgbouncer/cache_describe", func(t testing.TB) *sql.DB { db, _ := bouncer(t, "cache_describe"); return db }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := direct(t)
			db := tc.db(t)
			l := newLedger(t, admin)
			key := txlock.StringKey(uniq(t))
			errs := hammer(workers, iters, func() error {
				return txlock.WithLock(context.Background(), db, key, l.step, txlock.WithTimeout(30*time.Second))
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
	db := direct(t)
	l := newLedger(t, db)
	errs := hammer(8, 8, func() error {
		tx, err := db.Begin()
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }()
		if err := l.step(context.Background(), tx); err != nil {
			return err
		}
		return tx.Commit()
	})
	require.Empty(t, errs)
	n, overlaps := l.check(t, db)
	assert.Less(t, n, 64, "unlocked workload lost no update")
	assert.NotZero(t, overlaps)
}

// pgx's default exec mode, cache_statement, prepares named statements, which
// collide behind PgBouncer in transaction mode. The library's own statements
// take no parameters and go by the simple protocol, so they work in that
// mode too.
func TestPgBouncerCacheStatementMode(t *testing.T) {
	db, _ := bouncer(t, "cache_statement")
	admin := direct(t)
	l := newLedger(t, admin)
	key := txlock.StringKey(uniq(t))
	errs := hammer(8, 10, func() error {
		return txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `UPDATE `+l.Table+`_counter SET n = n + 1`)
			return err
		}, txlock.WithTimeout(30*time.Second))
	})
	require.Empty(t, errs)
	n, _ := l.check(t, admin)
	assert.Equal(t, 80, n)
}

func TestLockTimeout(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	hold(t, db, key, false)

	called := false
	start := time.Now()
	err := txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error {
		called = true
		return nil
	}, txlock.WithTimeout(time.Second))
	require.Error(t, err)
	assert.False(t, called)
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.NotErrorIs(t, err, context.DeadlineExceeded, "the timeout option, not the context, ran out")
	var te *txlock.LockTimeoutError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, []txlock.Key{key}, te.Keys)
	assert.Greater(t, te.Attempts, 2)
	assert.GreaterOrEqual(t, te.Waited, time.Second)
	assert.Less(t, time.Since(start), 3*time.Second)
	assert.Contains(t, err.Error(), key.String())

	// A context deadline earlier than the timeout wins, and shows.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = txlock.WithLock(ctx, db, key, func(context.Context, *sql.Tx) error { return nil })
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	// NoRetry gives up after one attempt.
	err = txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error { return nil }, txlock.WithRetry(txlock.NoRetry))
	require.ErrorAs(t, err, &te)
	assert.Equal(t, 1, te.Attempts)
}

// A cancelled context ends the wait as a cancellation, not as a timeout: the
// error matches context.Canceled and not ErrLockTimeout, and the event is
// Canceled. A deadline stays a timeout.
func TestCancelWhileWaiting(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	hold(t, db, key, false)
	var kinds kindRecorder

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	// A long sleep between attempts: the cancel must interrupt it.
	err := txlock.WithLock(ctx, db, key, func(context.Context, *sql.Tx) error { return nil },
		txlock.WithRetry(txlock.ConstantBackoff{Interval: time.Minute}), txlock.WithTimeout(time.Hour), txlock.WithObserver(&kinds))
	elapsed := time.Since(start)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
	assert.ErrorContains(t, err, "lock wait canceled")
	assert.Equal(t, txlock.Canceled, kinds.last())
	// A sleep left to run would last a minute; 2s leaves a loaded machine
	// room.
	assert.Less(t, elapsed, 2*time.Second)

	// Already cancelled: nothing is attempted.
	err = txlock.WithLock(ctx, db, key, func(context.Context, *sql.Tx) error { return nil })
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
	assert.ErrorContains(t, err, "after 0 attempts")
	_, err = txlock.TryWithLock(ctx, db, key, func(context.Context, *sql.Tx) error { return nil })
	assert.ErrorIs(t, err, context.Canceled)

	// The context's own deadline is a timeout.
	dctx, dcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer dcancel()
	err = txlock.WithLock(dctx, db, key, func(context.Context, *sql.Tx) error { return nil },
		txlock.WithRetry(txlock.ConstantBackoff{Interval: time.Minute}), txlock.WithTimeout(time.Hour), txlock.WithObserver(&kinds))
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, txlock.TimedOut, kinds.last())
}

// kindRecorder is an Observer that records the kinds of the events it sees.
type kindRecorder struct {
	mu    sync.Mutex
	kinds []txlock.EventKind
}

func (r *kindRecorder) Observe(ctx context.Context, e txlock.Event) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.kinds = append(r.kinds, e.Kind)
	return ctx
}

func (r *kindRecorder) last() txlock.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.kinds) == 0 {
		return 0
	}
	return r.kinds[len(r.kinds)-1]
}

func TestTryWithLock(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	release := hold(t, db, key, false)
	calls := 0
	fn := func(context.Context, *sql.Tx) error { calls++; return nil }

	ok, err := txlock.TryWithLock(context.Background(), db, key, fn)
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Zero(t, calls)

	release()
	ok, err = txlock.TryWithLock(context.Background(), db, key, fn)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 1, calls)

	sentinel := errors.New("job failed")
	ok, err = txlock.TryWithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error { return sentinel })
	assert.True(t, ok)
	assert.ErrorIs(t, err, sentinel)
}

func TestSharedAndExclusive(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	nop := func(context.Context, *sql.Tx) error { return nil }
	try := func(opts ...txlock.Option) bool {
		ok, err := txlock.TryWithLock(context.Background(), db, key, nop, opts...)
		require.NoError(t, err)
		return ok
	}

	release := hold(t, db, key, true)
	assert.True(t, try(txlock.WithShared()), "shared holders coexist")
	assert.False(t, try(), "a shared holder excludes an exclusive one")
	release()

	release = hold(t, db, key, false)
	assert.False(t, try(txlock.WithShared()), "an exclusive holder excludes a shared one")
	release()

	// Inside fn, the lock is shared: another shared holder gets in.
	err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		lock, ok := txlock.LockFromContext(ctx)
		require.True(t, ok)
		assert.True(t, lock.Shared)
		var other bool
		require.NoError(t, db.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock_shared("+lockArgs(key)+")").Scan(&other))
		assert.True(t, other)
		require.NoError(t, db.QueryRowContext(ctx, "SELECT pg_try_advisory_xact_lock("+lockArgs(key)+")").Scan(&other))
		assert.False(t, other)
		return nil
	}, txlock.WithShared())
	require.NoError(t, err)
}

func TestMultiKeyAllOrNothing(t *testing.T) {
	db := direct(t)
	k1, k2, k3 := txlock.StringKey(uniq(t)), txlock.Int64Key(time.Now().UnixNano()), txlock.PairKey(7, int32(time.Now().UnixNano()))
	nop := func(context.Context, *sql.Tx) error { return nil }

	release := hold(t, db, k2, false)
	ok, err := txlock.TryWithLocks(context.Background(), db, []txlock.Key{k1, k2, k3}, nop)
	require.NoError(t, err)
	assert.False(t, ok)
	// The partial grant did not stay held.
	assert.Zero(t, heldBy(t, db, k1))
	assert.Zero(t, heldBy(t, db, k3))

	// WithLocks waits for the whole set, then holds all of it.
	start := time.Now()
	time.AfterFunc(200*time.Millisecond, release)
	err = txlock.WithLocks(context.Background(), db, []txlock.Key{k3, k1, k2, k1}, func(ctx context.Context, tx *sql.Tx) error {
		lock, _ := txlock.LockFromContext(ctx)
		assert.Len(t, lock.Keys, 3, "duplicates removed")
		assert.Greater(t, lock.Attempts, 1)
		for _, k := range []txlock.Key{k1, k2, k3} {
			assert.Equal(t, 1, heldBy(t, db, k), "key %v", k)
		}
		return nil
	})
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)

	_, err = txlock.TryWithLocks(context.Background(), db, nil, nop)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
}

func TestFnPaths(t *testing.T) {
	db := direct(t)
	_, err := db.Exec(`CREATE TABLE IF NOT EXISTS fnpaths (v text PRIMARY KEY DEFERRABLE INITIALLY DEFERRED)`)
	require.NoError(t, err)
	key := txlock.StringKey(uniq(t))
	count := func(v string) int {
		var n int
		require.NoError(t, db.QueryRow(`SELECT count(*) FROM fnpaths WHERE v = $1`, v).Scan(&n))
		return n
	}
	insert := func(ctx context.Context, tx *sql.Tx, v string) {
		_, err := tx.ExecContext(ctx, `INSERT INTO fnpaths VALUES ($1)`, v)
		require.NoError(t, err)
	}

	t.Run("nil commits", func(t *testing.T) {
		v := uniq(t)
		require.NoError(t, txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			insert(ctx, tx, v)
			return nil
		}))
		assert.Equal(t, 1, count(v))
	})

	t.Run("error rolls back and is returned as is", func(t *testing.T) {
		v := uniq(t)
		var pathErr = &myError{"boom"}
		err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			insert(ctx, tx, v)
			return fmt.Errorf("wrapped: %w", pathErr)
		})
		var got *myError
		require.ErrorAs(t, err, &got)
		assert.Same(t, pathErr, got)
		assert.Equal(t, "wrapped: boom", err.Error())
		assert.Zero(t, count(v))
	})

	t.Run("panic rolls back and re-panics", func(t *testing.T) {
		v := uniq(t)
		var recovered any
		func() {
			defer func() { recovered = recover() }()
			_ = txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
				insert(ctx, tx, v)
				panic("fn exploded")
			})
		}()
		assert.Equal(t, "fn exploded", recovered)
		assert.Zero(t, count(v))
		assert.Zero(t, heldBy(t, db, key))
	})

	t.Run("panic(nil)", func(t *testing.T) {
		var recovered any
		func() {
			defer func() { recovered = recover() }()
			_ = txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error {
				panic(nil)
			})
		}()
		var pne *runtime.PanicNilError
		assert.ErrorAs(t, recovered.(error), &pne)
		assert.Zero(t, heldBy(t, db, key))
	})

	t.Run("fn commits itself", func(t *testing.T) {
		v := uniq(t)
		err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			insert(ctx, tx, v)
			return tx.Commit()
		})
		assert.ErrorIs(t, err, txlock.ErrFnEndedTx)
		assert.Equal(t, 1, count(v), "fn's own commit stands; no second commit was attempted")
	})

	t.Run("fn rolls back itself", func(t *testing.T) {
		err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			return tx.Rollback()
		})
		assert.ErrorIs(t, err, txlock.ErrFnEndedTx)
	})

	t.Run("commit fails", func(t *testing.T) {
		v := uniq(t)
		err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			insert(ctx, tx, v)
			insert(ctx, tx, v) // deferred unique check: fails at commit
			return nil
		})
		require.Error(t, err)
		assert.Equal(t, "23505", txlock.SQLState(err))
		assert.ErrorIs(t, err, txlock.ErrCommitFailed)
		assert.Contains(t, err.Error(), "txlock: commit failed: ")
		assert.Zero(t, count(v))
	})
}

type myError struct{ msg string }

func (e *myError) Error() string { return e.msg }

func TestMaxHold(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer conn.Close()

	// The server-side bound is applied to the lock's transaction only.
	before := time.Now()
	err = txlock.WithLock(context.Background(), conn, key, func(ctx context.Context, tx *sql.Tx) error {
		var setting string
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&setting))
		assert.Equal(t, "1501ms", setting)
		deadline, ok := ctx.Deadline()
		assert.True(t, ok, "fn's context carries the hold bound")
		assert.False(t, deadline.Before(before.Add(1500*time.Millisecond)), "the bound starts at the grant")
		assert.False(t, deadline.After(time.Now().Add(1501*time.Millisecond)), "the bound starts at the grant")
		return nil
	}, txlock.WithMaxHold(1500*time.Millisecond+time.Microsecond))
	require.NoError(t, err)
	var after string
	require.NoError(t, conn.QueryRowContext(context.Background(), `SELECT current_setting('idle_in_transaction_session_timeout')`).Scan(&after))
	assert.Equal(t, "0", after, "the setting must not outlive the transaction")

	// Client side: fn that outlives the bound is rolled back. Its INSERT
	// must get in before the bound: a second leaves a loaded machine room.
	_, err = db.Exec(`CREATE TABLE IF NOT EXISTS maxhold (v text)`)
	require.NoError(t, err)
	v := uniq(t)
	err = txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO maxhold VALUES ($1)`, v)
		require.NoError(t, err)
		time.Sleep(1500 * time.Millisecond)
		return nil
	}, txlock.WithMaxHold(time.Second))
	assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM maxhold WHERE v = $1`, v).Scan(&n))
	assert.Zero(t, n)

	// Server side: a holder idle in its transaction past the bound loses its
	// session, and with it the lock, even if the client never acts.
	tx, err := db.Begin()
	require.NoError(t, err)
	ok, err := txlock.TryLockTx(context.Background(), tx, key, txlock.WithMaxHold(200*time.Millisecond))
	require.NoError(t, err)
	require.True(t, ok)
	require.Eventually(t, func() bool { return heldBy(t, db, key) == 0 }, 3*time.Second, 20*time.Millisecond)
	assert.Error(t, tx.Commit(), "the server ended the session")
}

func TestWaitersHoldNoServerConnection(t *testing.T) {
	db, adminURL := bouncer(t, "exec")
	admin, err := sql.Open("pgx", adminURL)
	require.NoError(t, err)
	defer admin.Close()
	directDB := direct(t)
	key := txlock.StringKey(uniq(t))

	// The holder occupies one server connection through PgBouncer.
	holderTx, err := db.Begin()
	require.NoError(t, err)
	_, err = holderTx.Exec("SELECT pg_advisory_xact_lock(" + lockArgs(key) + ")")
	require.NoError(t, err)

	const waiters = 20 // the pool has 5 server connections
	var wg sync.WaitGroup
	var granted atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := txlock.WithLock(ctx, db, key, func(context.Context, *sql.Tx) error {
				granted.Add(1)
				return nil
			}, txlock.WithTimeout(20*time.Second))
			assert.NoError(t, err)
		}()
	}
	time.Sleep(300 * time.Millisecond)

	// Sample which clients PgBouncer has linked to a server connection. A
	// waiter that pinned a connection would be linked in every sample; a
	// polling waiter is linked only during its short attempts. Only the
	// holder, and the local queue's head, whose windows wait in the server
	// one after the other, may be linked throughout. (The control test below
	// shows blocking waiters linked throughout.)
	const samples = 20
	linked := map[string]int{}
	var longest time.Duration // of a backend's wait on the lock, over the samples
	for range samples {
		for c := range linkedClients(t, admin) {
			linked[c]++
		}
		longest = max(longest, longestAdvisoryWait(t, directDB))
		// An unrelated client always gets through (behind waiters that
		// pinned every server connection it would wait forever).
		qctx, qcancel := context.WithTimeout(context.Background(), 5*time.Second)
		var one int
		require.NoError(t, db.QueryRowContext(qctx, "SELECT 1").Scan(&one), "an unrelated client could not get a server connection")
		qcancel()
		time.Sleep(25 * time.Millisecond)
	}
	always := 0
	for _, n := range linked {
		if n == samples {
			always++
		}
	}
	t.Logf("%d waiters on a 5-connection pool: %d clients seen linked, %d linked in all %d samples", waiters, len(linked), always, samples)
	assert.LessOrEqual(t, always, 2, "only the holder and the queue's head may keep a server connection")
	assert.Zero(t, granted.Load())
	assert.LessOrEqual(t, countWaitingOnAdvisory(t, directDB), 1, "only the queue's head waits in the server")
	assert.Less(t, longest, maxWindowSeen, "the head's waits in the server are windows, not one wait without end")

	require.NoError(t, holderTx.Rollback())
	wg.Wait()
	assert.Equal(t, int32(waiters), granted.Load())
}

// The control for the test above: blocking waiters pin one server connection
// each, so the pool runs dry and clients queue. SHOW POOLS sees it.
func TestBlockingWaitersDoPinConnections(t *testing.T) {
	db, adminURL := bouncer(t, "exec")
	admin, err := sql.Open("pgx", adminURL)
	require.NoError(t, err)
	defer admin.Close()
	key := txlock.StringKey(uniq(t))
	release := hold(t, db, key, false)

	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tx, err := db.Begin()
			if !assert.NoError(t, err) {
				return
			}
			_, err = tx.Exec("SELECT pg_advisory_xact_lock(" + lockArgs(key) + ")")
			assert.NoError(t, err)
			assert.NoError(t, tx.Rollback())
		}()
	}
	require.Eventually(t, func() bool {
		p := showPools(t, admin)
		return p["sv_active"] == 5 && p["cl_waiting"] >= 4
	}, 5*time.Second, 20*time.Millisecond, "blocking waiters should exhaust the 5-connection pool")
	linked := map[string]int{}
	for range 10 {
		for c := range linkedClients(t, admin) {
			linked[c]++
		}
		time.Sleep(20 * time.Millisecond)
	}
	always := 0
	for _, n := range linked {
		if n == 10 {
			always++
		}
	}
	assert.Equal(t, 5, always, "the holder and four blocked waiters keep their server connections")
	release()
	wg.Wait()
}

// linkedClients returns the clients of database postgres that PgBouncer has
// linked to a server connection, as "addr:port".
func linkedClients(t *testing.T, admin *sql.DB) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, row := range showRows(t, admin, "SHOW CLIENTS") {
		if row["database"] == "postgres" && row["link"] != "" {
			out[row["addr"]+":"+row["port"]] = true
		}
	}
	return out
}

// showRows runs an admin console SHOW command.
func showRows(t *testing.T, admin *sql.DB, cmd string) []map[string]string {
	t.Helper()
	return locktest.Rows(t, admin, cmd)
}

// showPools sums SHOW POOLS columns over the pools of database postgres.
func showPools(t *testing.T, admin *sql.DB) map[string]int {
	t.Helper()
	sums := map[string]int{}
	for _, row := range showRows(t, admin, "SHOW POOLS") {
		if row["database"] != "postgres" {
			continue
		}
		for c, v := range row {
			var n int
			if _, err := fmt.Sscan(v, &n); err == nil {
				sums[c] += n
			}
		}
	}
	return sums
}

// longestAdvisoryWait returns how long the backend that has waited longest
// for an advisory lock has run its statement, or 0.
func longestAdvisoryWait(t *testing.T, db *sql.DB) time.Duration {
	var seconds float64
	require.NoError(t, db.QueryRow(`SELECT coalesce(max(extract(epoch FROM now() - query_start)), 0)::float8
		FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&seconds))
	return time.Duration(seconds * float64(time.Second))
}

// maxWindowSeen bounds a window's wait as the waiters tests sample it: the
// default's window is 200ms, and their samples span more than 500ms after
// the waiters began, so a wait without end would be seen past it.
const maxWindowSeen = 500 * time.Millisecond

func countWaitingOnAdvisory(t *testing.T, db *sql.DB) int {
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory'`).Scan(&n))
	return n
}

func TestStandbyRefused(t *testing.T) {
	db := open(t, pgtest.Standby(t))
	var inRecovery bool
	require.NoError(t, db.QueryRow(`SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.True(t, inRecovery)
	key := txlock.StringKey(uniq(t))
	called := false
	err := txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error {
		called = true
		return nil
	}, txlock.WithTxOptions(&sql.TxOptions{ReadOnly: true}))
	assert.ErrorIs(t, err, txlock.ErrStandby)
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
	assert.False(t, called)
	assert.Contains(t, err.Error(), key.String())

	tx, err := db.Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	_, err = txlock.TryLockTx(context.Background(), tx, key)
	assert.ErrorIs(t, err, txlock.ErrStandby)
	var one int
	assert.NoError(t, tx.QueryRow(`SELECT 1`).Scan(&one), "the caller's transaction is still usable")

	// Every form of the lock statement refuses: TryWithLock's, and
	// ServerWait's.
	acquired, err := txlock.TryWithLocks(context.Background(), db, []txlock.Key{key, txlock.StringKey(uniq(t))}, func(context.Context, *sql.Tx) error {
		called = true
		return nil
	}, txlock.WithMaxHold(time.Second))
	assert.ErrorIs(t, err, txlock.ErrStandby)
	assert.False(t, acquired)
	err = txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error {
		called = true
		return nil
	}, txlock.WithServerWait(txlock.ServerWait{}))
	assert.ErrorIs(t, err, txlock.ErrStandby)
	assert.False(t, called)
	assert.Zero(t, txlock.Queues())
}

// TestStandbyPromotedMidTransaction: a transaction begun on a standby stays
// read-only once the standby is promoted, while pg_is_in_recovery() turns
// false in it (on a Patroni failover, fn's first write failed with 25006:
// reliability/ha_test.go). In a transaction of txlock's own, every form of
// the attempt reports it as a standby's, so that the call is refused
// (ErrStandby) rather than granted a lock in which fn cannot write; begun
// READ ONLY, as WithTxOptions can ask, it is granted, as a caller's
// transaction is (LockTx). A transaction begun after the promotion writes.
func TestStandbyPromotedMidTransaction(t *testing.T) {
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	standby := pgtest.NewSyncStandby(t, primary)
	db := open(t, standby.URL())
	ctx := context.Background()
	begin := func(readOnly bool) *sql.Tx {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: readOnly})
		require.NoError(t, err)
		t.Cleanup(func() { tx.Rollback() })
		return tx
	}
	type begun struct {
		kind     string
		readOnly bool
		tx       *sql.Tx
	}
	var attempts []begun
	for _, kind := range []string{"poll", "semaphore", "server wait"} {
		for _, readOnly := range []bool{false, true} {
			attempts = append(attempts, begun{kind, readOnly, begin(readOnly)})
		}
	}
	probe, caller := begin(false), begin(false)
	require.NoError(t, standby.Promote())

	var inRecovery bool
	var readOnly string
	require.NoError(t, probe.QueryRowContext(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only')`).Scan(&inRecovery, &readOnly))
	assert.False(t, inRecovery, "pg_is_in_recovery() in a transaction begun before the promotion")
	assert.Equal(t, "on", readOnly, "transaction_read_only in it")
	_, err := probe.ExecContext(ctx, `CREATE TEMP TABLE promoted_probe (v int)`)
	assert.Equal(t, "25006", txlock.SQLState(err), "a write in it: %v", err)

	for _, a := range attempts {
		keys := []txlock.Key{txlock.StringKey(uniq(t) + a.kind)}
		if a.kind == "semaphore" {
			keys = append(keys, txlock.StringKey(uniq(t)+"slot 2"))
		}
		out, err := txlock.OwnTxAttempt(ctx, a.tx, a.kind, keys, a.readOnly)
		require.NoError(t, err, "%s, begun READ ONLY %v", a.kind, a.readOnly)
		want := "standby"
		if a.readOnly {
			want = "granted"
		}
		assert.Equal(t, want, out, "%s, begun READ ONLY %v", a.kind, a.readOnly)
	}
	acquired, err := txlock.TryLockTx(ctx, caller, txlock.StringKey(uniq(t)))
	require.NoError(t, err)
	assert.True(t, acquired, "LockTx in a caller's transaction begun before the promotion")
	require.NoError(t, txlock.WithLock(ctx, db, txlock.StringKey(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `CREATE TEMP TABLE promoted_after (v int)`)
		return err
	}))
}

// Under REPEATABLE READ the snapshot is taken by the lock statement, an
// instant before the grant. A racy read-modify-write must still lose nothing:
// PostgreSQL reports the stale snapshot as 40001, and WithLock re-runs fn.
func TestRepeatableReadLosesNoUpdate(t *testing.T) {
	for _, level := range []sql.IsolationLevel{sql.LevelRepeatableRead, sql.LevelSerializable} {
		t.Run(level.String(), func(t *testing.T) {
			db := direct(t)
			l := newLedger(t, db)
			key := txlock.StringKey(uniq(t))
			var runs atomic.Int32
			errs := hammer(8, 8, func() error {
				return txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
					runs.Add(1)
					var n int
					if err := tx.QueryRowContext(ctx, `SELECT n FROM `+l.Table+`_counter`).Scan(&n); err != nil {
						return err
					}
					_, err := tx.ExecContext(ctx, `UPDATE `+l.Table+`_counter SET n = $1`, n+1)
					return err
				}, txlock.WithTxOptions(&sql.TxOptions{Isolation: level}), txlock.WithTimeout(30*time.Second),
					txlock.WithSerializationRetries(100))
			})
			require.Empty(t, errs)
			n, _ := l.check(t, db)
			assert.Equal(t, 64, n)
			t.Logf("%d runs of fn for 64 increments", runs.Load())
		})
	}
}

func TestReadOnlyTx(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		assert.Equal(t, 1, heldBy(t, db, key))
		_, err := tx.ExecContext(ctx, `CREATE TEMP TABLE ro (x int)`)
		return err
	}, txlock.WithTxOptions(&sql.TxOptions{ReadOnly: true}))
	assert.Equal(t, "25006", txlock.SQLState(err), "read-only transaction: %v", err)
}

func TestLockTx(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	release := hold(t, db, key, false)

	tx, err := db.Begin()
	require.NoError(t, err)
	defer tx.Rollback()
	ok, err := txlock.TryLockTx(context.Background(), tx, key)
	require.NoError(t, err)
	assert.False(t, ok)

	err = txlock.LockTx(context.Background(), tx, key, txlock.WithTimeout(150*time.Millisecond))
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)

	time.AfterFunc(150*time.Millisecond, release)
	require.NoError(t, txlock.LockTx(context.Background(), tx, key, txlock.WithTimeout(10*time.Second)))
	assert.Equal(t, 1, heldBy(t, db, key))
	require.NoError(t, tx.Commit())
	assert.Zero(t, heldBy(t, db, key))

	// Options that belong to a transaction WithLock begins are refused.
	_, err = txlock.TryLockTx(context.Background(), tx, key, txlock.WithTxOptions(nil), txlock.WithFailOpen(nil))
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "WithTxOptions does not apply")
	assert.ErrorContains(t, err, "WithFailOpen does not apply")
	_, err = txlock.TryLockTx(context.Background(), nil, key)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
}

func TestFailOpen(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	hold(t, db, key, false)
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))

	var held, ran bool
	err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		ran, held = true, txlock.Held(ctx)
		return nil
	}, txlock.WithTimeout(100*time.Millisecond), txlock.WithFailOpen(logger))
	require.NoError(t, err)
	assert.True(t, ran)
	assert.False(t, held, "fn must be able to see that it runs unguarded")
	assert.Contains(t, logs.String(), "level=WARN")
	assert.Contains(t, logs.String(), "fail-open")
	assert.Contains(t, logs.String(), key.String()[:10])

	// Without the option: the timeout error, and fn does not run.
	ran = false
	err = txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error { ran = true; return nil },
		txlock.WithTimeout(100*time.Millisecond))
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.False(t, ran)

	// The caller's context ending is not a reason to run unguarded.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = txlock.WithLock(ctx, db, key, func(context.Context, *sql.Tx) error { ran = true; return nil },
		txlock.WithFailOpen(logger))
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, ran)

	// Held is true under a real lock.
	other := txlock.StringKey(uniq(t))
	require.NoError(t, txlock.WithLock(context.Background(), db, other, func(ctx context.Context, _ *sql.Tx) error {
		held = txlock.Held(ctx)
		return nil
	}, txlock.WithFailOpen(logger)))
	assert.True(t, held)
	assert.False(t, txlock.Held(context.Background()))
}

func TestSQLConnAsDB(t *testing.T) {
	db := direct(t)
	conn, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer conn.Close()
	key := txlock.StringKey(uniq(t))
	for range 3 {
		require.NoError(t, txlock.WithLock(context.Background(), conn, key, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "SELECT 1")
			return err
		}))
	}
}

// manyKeys returns n distinct keys of a keyspace named for name.
func manyKeys(name string, n int) []txlock.Key {
	ks := txlock.NewKeyspace(name)
	keys := make([]txlock.Key, n)
	for i := range keys {
		keys[i] = ks.Key(strconv.Itoa(i))
	}
	return keys
}

// MaxKeys distinct keys lock; duplicates do not count towards the bound,
// since they take no slot of the server's lock table.
func TestMaxKeys(t *testing.T) {
	db := direct(t)
	keys := manyKeys(uniq(t), txlock.MaxKeys)
	keys = append(keys, keys[:10]...)
	var held int
	require.NoError(t, txlock.WithLocks(context.Background(), db, keys, func(ctx context.Context, tx *sql.Tx) error {
		return tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&held)
	}))
	assert.Equal(t, txlock.MaxKeys, held)
}

// A lock statement that finds the server's shared lock table full fails with
// ErrLockTableFull, the server's 53200 still reachable. The server here has
// a small table (max_locks_per_transaction 10), and holders of MaxKeys keys
// each fill it.
func TestLockTableFull(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Settings: map[string]string{"max_locks_per_transaction": "10", "max_connections": "20"}})
	db := open(t, c.URL())
	ctx := context.Background()
	release := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(release)
	var err error
	for i := 0; i < 15 && err == nil; i++ {
		in := make(chan struct{})
		done := make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			done <- txlock.WithLocks(ctx, db, manyKeys(fmt.Sprint(uniq(t), i), txlock.MaxKeys), func(context.Context, *sql.Tx) error {
				close(in)
				<-release
				return nil
			})
		}()
		select {
		case <-in: // holding: the next holder adds to the table
		case err = <-done:
		}
	}
	require.Error(t, err, "15 holders of %d keys each did not fill a table sized for 10 locks per connection", txlock.MaxKeys)
	assert.ErrorIs(t, err, txlock.ErrLockTableFull)
	assert.Equal(t, "53200", txlock.SQLState(err))
	assert.ErrorContains(t, err, "raise max_locks_per_transaction")
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
}

func TestBadInput(t *testing.T) {
	// A pool on a port nobody listens on: nothing may reach it.
	db, err := sql.Open("pgx", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	key := txlock.StringKey("ok")
	nop := func(context.Context, *sql.Tx) error { return nil }
	var nilDB *sql.DB
	for _, tc := range []struct {
		name string
		err  error
		is   error
		msg  string
	}{
		{"nil db", txlock.WithLock(ctx, nil, key, nop), txlock.ErrInvalidArgument, "db is nil"},
		{"typed nil db", txlock.WithLock(ctx, nilDB, key, nop), txlock.ErrInvalidArgument, "db is nil"},
		{"nil fn", txlock.WithLock(ctx, db, key, nil), txlock.ErrInvalidArgument, "fn is nil"},
		{"zero key", txlock.WithLock(ctx, db, txlock.Key{}, nop), txlock.ErrInvalidKey, "zero Key"},
		{"empty name", txlock.WithLock(ctx, db, txlock.StringKey(""), nop), txlock.ErrInvalidKey, "empty"},
		{"bad utf-8", txlock.WithLock(ctx, db, txlock.StringKey("\xc3\x28"), nop), txlock.ErrInvalidKey, "UTF-8"},
		{"empty keyspace", txlock.WithLock(ctx, db, txlock.NewKeyspace("").Key("a"), nop), txlock.ErrInvalidKey, "keyspace name is empty"},
		{"one bad key of many", txlock.WithLocks(ctx, db, []txlock.Key{key, txlock.StringKey("a\x00")}, nop), txlock.ErrInvalidKey, "NUL"},
		{"zero timeout", txlock.WithLock(ctx, db, key, nop, txlock.WithTimeout(0)), txlock.ErrInvalidArgument, "WithTimeout needs a positive duration, got 0s"},
		{"negative hold", txlock.WithLock(ctx, db, key, nop, txlock.WithMaxHold(-time.Second)), txlock.ErrInvalidArgument, "WithMaxHold"},
		{"nil strategy", txlock.WithLock(ctx, db, key, nop, txlock.WithRetry(nil)), txlock.ErrInvalidArgument, "WithRetry"},
		{"min > max", txlock.WithLock(ctx, db, key, nop, txlock.WithRetry(txlock.ExponentialBackoff{Min: time.Second, Max: time.Millisecond})), txlock.ErrInvalidArgument, "Min 1s is greater than Max 1ms"},
		{"negative retries", txlock.WithLock(ctx, db, key, nop, txlock.WithSerializationRetries(-1)), txlock.ErrInvalidArgument, "WithSerializationRetries"},
		{"nil option", txlock.WithLock(ctx, db, key, nop, nil), txlock.ErrInvalidArgument, "nil Option"},
		{"too many keys", txlock.WithLocks(ctx, db, manyKeys("bad input", txlock.MaxKeys+1), nop), txlock.ErrInvalidArgument, "1001 distinct keys in one call, more than MaxKeys (1000)"},
		{"too many keys in a try", func() error {
			_, err := txlock.TryWithLocks(ctx, db, manyKeys("bad input", txlock.MaxKeys+1), nop)
			return err
		}(), txlock.ErrInvalidArgument, "more than MaxKeys"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, tc.err, tc.is)
			assert.ErrorContains(t, tc.err, tc.msg)
		})
	}
	assert.Zero(t, db.Stats().OpenConnections, "bad input must not reach the database")

	// Unreachable server: a clear connection error, not a lock timeout.
	err = txlock.WithLock(ctx, db, key, nop)
	require.Error(t, err)
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
	assert.Contains(t, err.Error(), "txlock: begin")
	assert.Zero(t, db.Stats().InUse)
}

func TestLockStatementShape(t *testing.T) {
	keys := []txlock.Key{txlock.Int64Key(-9223372036854775808), txlock.PairKey(-1, 2)}
	locks := "pg_catalog.pg_try_advisory_xact_lock_shared('-9223372036854775808'::bigint) AND pg_catalog.pg_try_advisory_xact_lock_shared('-1'::integer,'2'::integer)"
	// The idle bound is set before any lock is tried, so that it also covers
	// a partial grant whose rollback never arrives; transaction_timeout
	// (the bound of 1500ms plus a tenth) only once every lock is granted,
	// where the server has it, and only in nested CASE branches: set_config
	// of a setting the server lacks fails the statement.
	txTimeout := " WHEN CASE WHEN pg_catalog.current_setting('transaction_timeout', true) IS NULL THEN false" +
		" WHEN pg_catalog.current_setting('transaction_timeout', true) OPERATOR(pg_catalog.=) '0'" +
		" THEN pg_catalog.set_config('transaction_timeout', '1650', true) IS NULL" +
		" WHEN (pg_catalog.transaction_timestamp() OPERATOR(pg_catalog.+) CAST(pg_catalog.current_setting('transaction_timeout', true) AS interval))" +
		" OPERATOR(pg_catalog.>) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) CAST('1650ms' AS interval))" +
		" THEN CASE WHEN pg_catalog.set_config('transaction_timeout', '0', true) IS NULL THEN false" +
		" ELSE pg_catalog.set_config('transaction_timeout', '1650', true) IS NULL END ELSE false END"
	inTx := txlock.LockStatement(keys, true, 1500*time.Millisecond, txlock.FormCallerTx)
	assert.Equal(t, "SELECT 1 FROM pg_catalog.generate_series(1, CASE WHEN pg_catalog.pg_is_in_recovery() THEN 2"+
		" WHEN pg_catalog.set_config('idle_in_transaction_session_timeout', '1500', true) IS NULL THEN 0"+
		" WHEN NOT ("+locks+") THEN 0"+txTimeout+" THEN 0 ELSE 1 END)", inTx)
	// In txlock's own transaction, begun without READ ONLY, a read-only
	// transaction counts as in recovery (see TestStandbyPromotedMidTransaction).
	inRecovery := "(pg_catalog.pg_is_in_recovery() OR (pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'" +
		" AND pg_catalog.current_setting('default_transaction_read_only') OPERATOR(pg_catalog.=) 'off'))"
	ownTx := txlock.LockStatement(keys, true, 1500*time.Millisecond, txlock.FormOwnTx)
	assert.Equal(t, "SELECT 1 WHERE CASE WHEN "+inRecovery+" THEN CAST(pg_catalog.set_config('txlock.in_recovery', "+
		"'txlock: the server is in recovery, no lock was attempted', true) AS integer) IS NULL"+
		" WHEN pg_catalog.set_config('idle_in_transaction_session_timeout', '1500', true) IS NULL THEN false"+
		" WHEN NOT ("+locks+") THEN false"+txTimeout+" THEN false ELSE true END", ownTx)
	// Without a hold bound, the statements set nothing.
	plainInTx := txlock.LockStatement(keys, true, 0, txlock.FormCallerTx)
	assert.Equal(t, "SELECT 1 FROM pg_catalog.generate_series(1, CASE WHEN pg_catalog.pg_is_in_recovery() THEN 2 WHEN "+
		locks+" THEN 1 ELSE 0 END)", plainInTx)
	plainOwnTx := txlock.LockStatement(keys, true, 0, txlock.FormOwnTx)
	assert.Equal(t, "SELECT 1 WHERE CASE WHEN "+inRecovery+" THEN CAST(pg_catalog.set_config('txlock.in_recovery', "+
		"'txlock: the server is in recovery, no lock was attempted', true) AS integer) IS NULL WHEN "+
		locks+" THEN true ELSE false END", plainOwnTx)
	// The margin is a tenth of the bound, at least 20ms and at most 1s, and
	// no value exceeds what the settings accept (2147483647 ms).
	for d, want := range map[time.Duration][2]string{
		50 * time.Millisecond: {"50", "70"},
		time.Second:           {"1000", "1100"},
		time.Minute:           {"60000", "61000"},
		30 * 24 * time.Hour:   {"2147483647", "2147483647"},
	} {
		stmt := txlock.LockStatement(keys[:1], false, d, txlock.FormOwnTx)
		assert.Contains(t, stmt, "set_config('idle_in_transaction_session_timeout', '"+want[0]+"', true)", "bound %v", d)
		assert.Contains(t, stmt, "set_config('transaction_timeout', '"+want[1]+"', true)", "bound %v", d)
		assert.Contains(t, stmt, "CAST('"+want[1]+"ms' AS interval)", "bound %v", d)
	}
	for _, stmt := range []string{inTx, ownTx, plainInTx, plainOwnTx} {
		assert.NotContains(t, strings.ToUpper(stmt), "SET ", "never a plain SET")
		assert.NotContains(t, stmt, "$", "no parameters")
	}
}

func TestExtremeKeysLock(t *testing.T) {
	db := direct(t)
	for _, k := range []txlock.Key{txlock.Int64Key(-9223372036854775808), txlock.Int64Key(9223372036854775807),
		txlock.PairKey(-2147483648, 2147483647)} {
		require.NoError(t, txlock.WithLock(context.Background(), db, k, func(ctx context.Context, tx *sql.Tx) error {
			assert.Equal(t, 1, heldBy(t, db, k), "%v", k)
			return nil
		}))
	}
}

// WithTimeout bounds the first attempt too: here it cannot even get a
// connection from the pool.
func TestTimeoutBoundsFirstAttempt(t *testing.T) {
	db := direct(t)
	db.SetMaxOpenConns(1)
	busy, err := db.Begin() // takes the pool's only connection
	require.NoError(t, err)
	defer busy.Rollback()
	start := time.Now()
	err = txlock.WithLock(context.Background(), db, txlock.StringKey(uniq(t)), func(context.Context, *sql.Tx) error { return nil },
		txlock.WithTimeout(200*time.Millisecond))
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.Less(t, time.Since(start), 2*time.Second)
	var te *txlock.LockTimeoutError
	require.ErrorAs(t, err, &te)
	assert.Zero(t, te.Attempts)
}

// Callers of one process that wait for the same key queue locally: only the
// head polls, and each of the others tries at most once on arrival and once
// on its turn; a caller that arrives when others are queued joins them
// without trying. A queued caller still times out on time, and the queues
// go away.
func TestLocalQueue(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	release := hold(t, db, key, false)

	const callers = 8
	attempts := make(chan int, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
				lock, _ := txlock.LockFromContext(ctx)
				attempts <- lock.Attempts
				return nil
			}, txlock.WithTimeout(20*time.Second)))
		}()
	}
	require.Eventually(t, func() bool { return txlock.QueueRefs() == callers }, 10*time.Second, time.Millisecond, "every caller queues")

	// A caller queued behind the others gives up at its own deadline.
	start := time.Now()
	err := txlock.WithLock(context.Background(), db, key, func(context.Context, *sql.Tx) error { return nil },
		txlock.WithTimeout(200*time.Millisecond))
	var te *txlock.LockTimeoutError
	require.ErrorAs(t, err, &te)
	// Past its deadline it would wait for the holder, which lets go only
	// below.
	assert.Less(t, time.Since(start), 2*time.Second)
	assert.Zero(t, te.Attempts, "a caller arriving behind a queue joins it without trying, and does not poll")

	release()
	wg.Wait()
	close(attempts)
	polled := 0
	for n := range attempts {
		if n > 2 {
			polled++
		}
	}
	assert.LessOrEqual(t, polled, 1, "only the head of the queue polls")
	assert.Zero(t, txlock.Queues(), "queues are removed when empty")
}

// When a polling caller that has the turn of a local queue is done with fn,
// the next caller in the queue begins its transaction while the COMMIT is
// in flight, and sends its lock statement once the COMMIT has returned: its
// one attempt finds the lock free, and at RepeatableRead its snapshot,
// taken by that statement, sees what the previous holder committed. It
// holds that transaction for at most 50 ms of a slow COMMIT (1.5 s here),
// then waits without a connection. A caller that gives up while it waits
// for the COMMIT hands the wait on to the next.
func TestPollingEarlyHandoff(t *testing.T) {
	app := strings.NewReplacer("/", "_").Replace(uniq(t))
	url := pgtest.Postgres(t)
	if strings.Contains(url, "?") {
		url += "&application_name=" + app
	} else {
		url += "?application_name=" + app
	}
	db := open(t, url)
	admin := direct(t)
	// An early BEGIN is rolled back after maxEarlyBegin (50ms): 150ms here,
	// so that a loaded machine's samples, each a query, still see it, and
	// below the second caller's 200ms.
	txlock.SetMaxEarlyBegin(t, 150*time.Millisecond)
	// The early BEGIN takes an idle connection of the pool (without one it
	// would wait for the holder's): have two.
	var conns []*sql.Conn
	for range 2 {
		c, err := db.Conn(context.Background())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	table := `"` + uniq(t) + `"`
	_, err := admin.Exec(`CREATE TABLE ` + table + ` (id int);
		CREATE OR REPLACE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN PERFORM pg_sleep(1.5); RETURN NULL; END $$;
		CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON ` + table + ` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit()`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(`DROP TABLE ` + table + `; DROP FUNCTION slow_commit()`) })

	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	release := hold(t, admin, key, false)
	rr := txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})

	// The first caller polls until release, then holds the turn; its fn
	// returns once two more callers are queued behind it, and its COMMIT
	// then takes 1.5 s.
	fnDone := make(chan struct{})
	var start time.Time // fn's return: the COMMIT starts after it
	var holderPID int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		assert.NoError(t, txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
			if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&holderPID); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO `+table+` VALUES (1)`); err != nil {
				return err
			}
			assert.Eventually(t, func() bool { return txlock.QueueRefs() == 3 }, 10*time.Second, time.Millisecond)
			start = time.Now()
			close(fnDone)
			return nil
		}, txlock.WithTimeout(20*time.Second)))
	}()
	require.Eventually(t, func() bool { return txlock.QueueRefs() == 1 }, 10*time.Second, time.Millisecond, "the first caller queues")
	release()

	// The second caller gives up 200 ms into the first one's COMMIT.
	giveUp, cancelSecond := context.WithCancel(ctx)
	defer cancelSecond()
	// If the test stops early, its calls end before maxEarlyBegin is
	// restored (cleanups run last first).
	t.Cleanup(func() { cancelSecond(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := txlock.WithLock(giveUp, db, key, func(context.Context, *sql.Tx) error {
			t.Error("the second caller's fn ran")
			return nil
		}, txlock.WithTimeout(20*time.Second), rr)
		assert.ErrorIs(t, err, context.Canceled)
	}()
	require.Eventually(t, func() bool { return txlock.QueueRefs() == 2 }, 10*time.Second, time.Millisecond)
	var lock txlock.Lock
	var seen int
	var thirdStarted time.Time
	wg.Add(1)
	go func() {
		defer wg.Done()
		assert.NoError(t, txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
			thirdStarted = time.Now()
			lock, _ = txlock.LockFromContext(ctx)
			return tx.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&seen)
		}, txlock.WithTimeout(20*time.Second), rr))
	}()

	// While the first caller's 1.5 s COMMIT runs, a waiter of the same
	// pool is idle in its transaction at first (the second caller for 150
	// ms, then the third for 150 ms once the second has given up at 200 ms),
	// and none is for the rest of it. Samples stop well before the COMMIT
	// can end, after which the third caller's own transaction is idle
	// between its statements. The last idle sample may come late on a
	// loaded machine, but not as late as 1.2 s: a waiter that kept its
	// transaction through the COMMIT would be seen idle until 1.4 s.
	<-fnDone
	time.AfterFunc(200*time.Millisecond, cancelSecond)
	var idle []time.Duration
	for {
		at := time.Since(start)
		if at > 1400*time.Millisecond {
			break
		}
		var n int
		require.NoError(t, admin.QueryRow(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'idle in transaction' AND pid <> $2`, app, holderPID).Scan(&n))
		if time.Since(start) > 1450*time.Millisecond {
			break // a sample this late may have seen the third caller's lock
		}
		if n > 0 {
			idle = append(idle, at)
		}
		time.Sleep(2 * time.Millisecond)
	}
	wg.Wait()
	require.NotEmpty(t, idle, "the next caller begins its transaction during the COMMIT")
	t.Logf("a waiter was idle in its transaction in %d samples, the last %v after fn returned; the third caller's fn started after %v", len(idle), idle[len(idle)-1], thirdStarted.Sub(start))
	assert.Less(t, idle[len(idle)-1], 1200*time.Millisecond, "no waiter holds its transaction through a slow COMMIT")
	assert.Greater(t, thirdStarted.Sub(start), 1400*time.Millisecond, "the third caller's fn starts after the first's COMMIT has returned")
	assert.Equal(t, 1, lock.Attempts, "its one attempt found the lock free")
	assert.Equal(t, 1, seen, "its snapshot sees the first caller's row")
	assert.Zero(t, txlock.Queues(), "queues are removed when empty")
}

// fn's context is the caller's, with the lock's state added: values,
// deadline and cancellation pass through, contexts derived from it still
// find the Lock, and a context kept from a round that a serialization
// failure ended keeps describing that round, not the next.
func TestFnContext(t *testing.T) {
	db := direct(t)
	_, err := db.Exec(`CREATE TABLE fnctx (id int PRIMARY KEY, n int NOT NULL); INSERT INTO fnctx VALUES (1, 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE fnctx`) })

	type ctxKey struct{}
	caller, cancel := context.WithTimeout(context.WithValue(context.Background(), ctxKey{}, "v"), time.Minute)
	defer cancel()
	want, _ := caller.Deadline()
	var kept []context.Context
	err = txlock.WithLock(caller, db, txlock.StringKey(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
		kept = append(kept, ctx)
		assert.Equal(t, "txlock.fnContext", fmt.Sprint(ctx), "printing the context does not walk the lock's state")
		assert.Equal(t, "v", ctx.Value(ctxKey{}))
		d, ok := ctx.Deadline()
		assert.True(t, ok)
		assert.Equal(t, want, d)
		assert.True(t, txlock.Held(ctx))
		derived, cancelDerived := context.WithCancel(ctx)
		lock, ok := txlock.LockFromContext(derived)
		assert.True(t, ok)
		assert.Equal(t, 1, lock.Attempts, "each round takes the free lock at once")
		assert.True(t, txlock.Held(derived))
		cancelDerived()
		assert.False(t, txlock.Held(derived), "a cancelled derived context no longer holds")
		assert.True(t, txlock.Held(ctx))
		if len(kept) > 1 {
			assert.False(t, txlock.Held(kept[0]), "the first round's context outlived its round")
			_, ok := txlock.LockFromContext(kept[0])
			assert.True(t, ok)
		}
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT n FROM fnctx WHERE id = 1`).Scan(&n); err != nil {
			return err
		}
		if len(kept) == 1 {
			// A concurrent write after this transaction's snapshot: the
			// UPDATE below fails with 40001 at RepeatableRead.
			_, err := db.ExecContext(caller, `UPDATE fnctx SET n = n + 100 WHERE id = 1`)
			require.NoError(t, err)
		}
		_, err := tx.ExecContext(ctx, `UPDATE fnctx SET n = $1 WHERE id = 1`, n+1)
		return err
	}, txlock.WithTxOptions(&sql.TxOptions{Isolation: sql.LevelRepeatableRead}), txlock.WithSerializationRetries(1))
	require.NoError(t, err)
	require.Len(t, kept, 2, "one serialization failure, one retry")
	assert.False(t, txlock.Held(kept[1]), "fn has returned")
	var n int
	require.NoError(t, db.QueryRow(`SELECT n FROM fnctx WHERE id = 1`).Scan(&n))
	assert.Equal(t, 101, n)
}

// A try whose one attempt cannot get a connection before its timeout ends
// as a wait does (see LockTimeoutError): at WithTimeout or the context's
// deadline, a timeout, and not context.Canceled; when the context is
// cancelled, a cancellation. Here the pool's one connection is in use.
func TestTryTimesOutWaitingForConnection(t *testing.T) {
	db := direct(t)
	db.SetMaxOpenConns(1)
	c, err := db.Conn(context.Background())
	require.NoError(t, err)
	defer c.Close()
	fn := func(context.Context, *sql.Tx) error { t.Error("fn ran"); return nil }
	var kinds kindRecorder

	ok, err := txlock.TryWithLock(context.Background(), db, txlock.StringKey(uniq(t)), fn, txlock.WithTimeout(200*time.Millisecond), txlock.WithObserver(&kinds))
	assert.False(t, ok)
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.NotErrorIs(t, err, context.Canceled)
	assert.Equal(t, txlock.TimedOut, kinds.last())
	// WithFailOpen is WithLock's: a try that times out does not run fn.
	ok, err = txlock.TryWithLock(context.Background(), db, txlock.StringKey(uniq(t)), fn, txlock.WithTimeout(200*time.Millisecond), txlock.WithFailOpen(nil))
	assert.False(t, ok)
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)

	dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer dcancel()
	ok, err = txlock.TryWithLock(dctx, db, txlock.StringKey(uniq(t)), fn)
	assert.False(t, ok)
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)
	assert.ErrorIs(t, err, context.DeadlineExceeded)

	cctx, ccancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, ccancel)
	ok, err = txlock.TryWithLock(cctx, db, txlock.StringKey(uniq(t)), fn, txlock.WithObserver(&kinds))
	assert.False(t, ok)
	assert.ErrorIs(t, err, context.Canceled)
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
	assert.Equal(t, txlock.Canceled, kinds.last())
}
