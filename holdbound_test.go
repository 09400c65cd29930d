package txlock_test

import (
	"context"
	"database/sql"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// The server side of WithMaxHold on every server version: the idle bound
// (idle_in_transaction_session_timeout) everywhere, and, where the server
// has it (PostgreSQL 17 and later), transaction_timeout too, which also ends
// a statement that runs past the bound. Each test reads server_version_num
// and asserts what that version does; none is skipped for its version.

// holdBound is the bound the tests hold locks under, and boundTxTimeout the
// transaction_timeout it sets: the bound plus a tenth (txTimeoutMargin).
const (
	holdBound      = time.Second
	boundTxTimeout = "1100ms"
	// longSleep is the statement that runs past the bound: far enough past
	// it that a lock lost at the bound and one held to the statement's end
	// cannot be confused, even on a loaded machine.
	longSleep = "SELECT pg_catalog.pg_sleep(2.5)"
	sleepFor  = 2500 * time.Millisecond
)

// serverVersion returns the server_version_num of the server behind q.
func serverVersion(t testing.TB, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) int {
	t.Helper()
	var v int
	require.NoError(t, q.QueryRowContext(context.Background(), `SELECT pg_catalog.current_setting('server_version_num')::integer`).Scan(&v))
	return v
}

// hasTxTimeout reports whether a server of version v has transaction_timeout.
func hasTxTimeout(v int) bool { return v >= 170000 }

// txTimeout returns transaction_timeout as q's transaction sees it, or NULL
// where the server has no such setting.
func txTimeout(t testing.TB, ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}) sql.NullString {
	t.Helper()
	var v sql.NullString
	require.NoError(t, q.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('transaction_timeout', true)`).Scan(&v))
	return v
}

// assertTxTimeout asserts that q's transaction has transaction_timeout want
// on a server that has the setting (v >= 17), and that the setting does not
// exist on one that has not.
func assertTxTimeout(t testing.TB, ctx context.Context, q interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}, v int, want string) {
	t.Helper()
	got := txTimeout(t, ctx, q)
	if hasTxTimeout(v) {
		assert.Equal(t, sql.NullString{String: want, Valid: true}, got, "transaction_timeout on server %d", v)
	} else {
		assert.False(t, got.Valid, "server %d has no transaction_timeout, yet current_setting returned %q", v, got.String)
	}
}

// grab waits, on a connection of db of its own, for k with the blocking
// pg_advisory_xact_lock (for at most 10s), and reports when it got it. The
// lock is released at once.
func grab(db *sql.DB, k txlock.Key) <-chan grabbed {
	ch := make(chan grabbed, 1)
	go func() {
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			ch <- grabbed{err: err}
			return
		}
		defer func() { _ = tx.Rollback() }()
		_, err = tx.ExecContext(ctx, `SELECT pg_catalog.set_config('lock_timeout', '10s', true), pg_advisory_xact_lock(`+lockArgs(k)+`)`)
		ch <- grabbed{at: time.Now(), err: err}
	}()
	return ch
}

type grabbed struct {
	at  time.Time
	err error
}

// lostAt waits for g and returns when another connection got the lock.
func lostAt(t testing.TB, g <-chan grabbed) time.Time {
	t.Helper()
	select {
	case r := <-g:
		require.NoError(t, r.err, "another connection waiting for the lock")
		return r.at
	case <-time.After(15 * time.Second):
		t.Fatal("another connection did not get the lock within 15s")
		return time.Time{}
	}
}

// assertLongStatementLoses runs a statement longer than the bound in tx,
// which holds key since a grant between sent and granted (see assertLost),
// and checks that the lock is lost to another connection of db at the
// bound on 17+ (the statement then fails with 25P04) and only when the
// statement ends before 17.
func assertLongStatementLoses(t testing.TB, v int, db *sql.DB, tx *sql.Tx, key txlock.Key, sent, granted time.Time) {
	t.Helper()
	got := grab(db, key)
	_, stmtErr := tx.ExecContext(context.Background(), longSleep)
	_ = tx.Rollback() // where the statement ran to its end, at once rather than after the idle bound
	assertLost(t, v, sent, granted, lostAt(t, got))
	if hasTxTimeout(v) {
		assert.Equal(t, "25P04", txlock.SQLState(stmtErr), "%v", stmtErr)
	} else {
		assert.NoError(t, stmtErr)
	}
}

// assertLost asserts when another connection got (at lost) a lock that was
// granted and then held by one statement of sleepFor: on a server with
// transaction_timeout, at about the bound plus its margin (never before the
// bound, and well before the statement would have ended); on an older one,
// only when the statement ended, since the idle bound does not cover a
// running statement. The server granted the lock, and started the bound's
// timer, after sent (when the lock statement was sent, or the holder before
// it let go) and before granted (when the client saw the grant): the lower
// bound counts from sent and the upper bounds from granted, so that a pause
// of the client between the two moves neither. The statement starts after
// granted, so a lock held to its end is lost at least sleepFor after it.
func assertLost(t testing.TB, v int, sent, granted, lost time.Time) {
	t.Helper()
	t.Logf("server %d: another connection got the lock %v after the grant (%v after the lock statement was sent)",
		v, lost.Sub(granted).Round(time.Millisecond), lost.Sub(sent).Round(time.Millisecond))
	if hasTxTimeout(v) {
		assert.GreaterOrEqual(t, lost.Sub(sent), holdBound, "the lock was lost before the bound")
		assert.Less(t, lost.Sub(granted), sleepFor-100*time.Millisecond, "transaction_timeout did not end the statement that ran past the bound")
	} else {
		assert.GreaterOrEqual(t, lost.Sub(granted), sleepFor-100*time.Millisecond, "without transaction_timeout the holder keeps the lock to the statement's end")
	}
}

// A holder whose one statement runs past the bound, on a context the client
// does not cancel (database/sql cannot roll a transaction back while one of
// its statements runs, so only the server can end it), loses the lock at the
// bound on 17 and later, and WithLock still reports ErrHoldTimeout.
func TestMaxHoldLongStatement(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			var db *sql.DB
			if via == "direct" {
				db = direct(t)
			} else {
				db, _ = bouncer(t, "exec")
			}
			v := serverVersion(t, db)
			other := direct(t)
			key := txlock.StringKey(uniq(t))
			var granted time.Time
			var got <-chan grabbed
			var stmtErr error
			sent := time.Now() // the key is free: granted at the first attempt
			err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
				granted = time.Now()
				assertTxTimeout(t, ctx, tx, v, boundTxTimeout)
				got = grab(other, key)
				_, stmtErr = tx.ExecContext(context.Background(), longSleep)
				return stmtErr
			}, txlock.WithMaxHold(holdBound))
			require.False(t, granted.IsZero(), "fn did not run: %v", err)
			assertLost(t, v, sent, granted, lostAt(t, got))
			assert.ErrorIs(t, err, txlock.ErrHoldTimeout, "the hold bound ended the transaction")
			if hasTxTimeout(v) {
				assert.Equal(t, "25P04", txlock.SQLState(stmtErr), "the statement was ended by transaction_timeout: %v", stmtErr)
				assert.Equal(t, "25P04", txlock.SQLState(err), "WithLock's error keeps the server's: %v", err)
			} else {
				assert.NoError(t, stmtErr, "without transaction_timeout the statement runs to its end")
			}
		})
	}
}

// The bound counts from the grant: neither the age of the transaction when
// the lock statement runs nor a ServerWait wait inside that statement counts.
// (PostgreSQL starts transaction_timeout's timer when it is set inside a
// transaction, not at BEGIN.)
func TestMaxHoldCountsFromGrant(t *testing.T) {
	t.Run("lock statement by hand in an aged transaction", func(t *testing.T) {
		db := direct(t)
		v := serverVersion(t, db)
		key := txlock.StringKey(uniq(t))
		ctx := context.Background()
		conn, err := db.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		tx, err := conn.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		// Older than the bound's margin: had the timer counted from BEGIN,
		// the lock would be lost 0.5s after the grant.
		_, err = tx.ExecContext(ctx, `SELECT pg_catalog.pg_sleep(0.6)`)
		require.NoError(t, err)
		sent := time.Now()
		res, err := tx.ExecContext(ctx, txlock.LockStatement([]txlock.Key{key}, false, holdBound, txlock.FormOwnTx))
		require.NoError(t, err)
		granted := time.Now()
		n, err := res.RowsAffected()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the lock statement grants a free lock")
		assertTxTimeout(t, ctx, tx, v, boundTxTimeout)
		assertLongStatementLoses(t, v, db, tx, key, sent, granted)
	})

	t.Run("ServerWait wait longer than the bound", func(t *testing.T) {
		db := direct(t)
		v := serverVersion(t, db)
		key := txlock.StringKey(uniq(t))
		release := hold(t, db, key, false)
		wait := holdBound + 300*time.Millisecond
		start := time.Now()
		// When the holder begins to let go: the grant comes after it.
		releasing := make(chan time.Time, 1)
		time.AfterFunc(wait, func() {
			releasing <- time.Now()
			release()
		})
		var granted time.Time
		var got <-chan grabbed
		err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			granted = time.Now()
			assertTxTimeout(t, ctx, tx, v, boundTxTimeout)
			got = grab(db, key)
			_, err := tx.ExecContext(context.Background(), longSleep)
			return err
		}, txlock.WithServerWait(txlock.ServerWait{Window: 10 * time.Second}), txlock.WithMaxHold(holdBound), txlock.WithTimeout(10*time.Second))
		require.False(t, granted.IsZero(), "fn did not run: %v", err)
		assert.GreaterOrEqual(t, granted.Sub(start), wait-50*time.Millisecond,
			"the lock was granted before its holder released it")
		assertLost(t, v, <-releasing, granted, lostAt(t, got))
		assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
	})
}

// In LockTx the bound applies to the caller's transaction from the grant,
// however old that transaction is: it does not end the transaction at once,
// and a statement past the bound ends it on 17 and later.
func TestMaxHoldLockTx(t *testing.T) {
	for _, mode := range []struct {
		name string
		opts []txlock.Option
	}{
		{"polling", nil},
		{"ServerWait", []txlock.Option{txlock.WithServerWait(txlock.ServerWait{Window: time.Second})}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			db := direct(t)
			v := serverVersion(t, db)
			key := txlock.StringKey(uniq(t))
			ctx := context.Background()
			tx, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			// Older than the bound and its margin.
			_, err = tx.ExecContext(ctx, `SELECT pg_catalog.pg_sleep(1.3)`)
			require.NoError(t, err)
			sent := time.Now()
			require.NoError(t, txlock.LockTx(ctx, tx, key, append(mode.opts, txlock.WithMaxHold(holdBound))...))
			granted := time.Now()
			var one int
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one), "the caller's transaction outlived the grant")
			assertTxTimeout(t, ctx, tx, v, boundTxTimeout)
			assertLongStatementLoses(t, v, db, tx, key, sent, granted)
		})
	}

	// A busy attempt sets no transaction_timeout: in LockTx it does not
	// roll back, and the caller's transaction goes on without the lock.
	t.Run("busy", func(t *testing.T) {
		db := direct(t)
		v := serverVersion(t, db)
		key := txlock.StringKey(uniq(t))
		hold(t, db, key, false)
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		ok, err := txlock.TryLockTx(ctx, tx, key, txlock.WithMaxHold(holdBound))
		require.NoError(t, err)
		require.False(t, ok)
		assertTxTimeout(t, ctx, tx, v, "0")
	})
}

// A transaction_timeout already in force (from the server, role, database or
// connection) keeps a running timer that a new value does not restart, and
// while it is not below the idle bound PostgreSQL does not arm the idle
// bound at all. The lock statement therefore restarts the timer with the
// hold bound when the bound in force would end later, and leaves it alone
// when it would end no later.
func TestMaxHoldBoundInForce(t *testing.T) {
	db := direct(t)
	v := serverVersion(t, db)
	if !hasTxTimeout(v) {
		// Nothing can be in force: the setting does not exist.
		tx, err := db.Begin()
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = tx.Exec(`SELECT pg_catalog.set_config('transaction_timeout', '1min', true)`)
		assert.Equal(t, "42704", txlock.SQLState(err), "server %d: transaction_timeout must be unknown: %v", v, err)
		return
	}

	t.Run("longer bound of the connection: restarted with the hold bound", func(t *testing.T) {
		// A connection default of one minute, as a role or server default
		// would be, in force from BEGIN: merely setting transaction_timeout
		// would leave that minute's timer in charge.
		u, err := url.Parse(pgtest.Postgres(t))
		require.NoError(t, err)
		q := u.Query()
		q.Set("transaction_timeout", "1min")
		u.RawQuery = q.Encode()
		db := open(t, u.String())
		key := txlock.StringKey(uniq(t))
		var granted time.Time
		var got <-chan grabbed
		var stmtErr error
		sent := time.Now() // the key is free: granted at the first attempt
		err = txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			granted = time.Now()
			assertTxTimeout(t, ctx, tx, v, boundTxTimeout)
			got = grab(direct(t), key)
			_, stmtErr = tx.ExecContext(context.Background(), longSleep)
			return stmtErr
		}, txlock.WithMaxHold(holdBound))
		require.False(t, granted.IsZero(), "fn did not run: %v", err)
		assertLost(t, v, sent, granted, lostAt(t, got))
		assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
		assert.Equal(t, "25P04", txlock.SQLState(stmtErr), "%v", stmtErr)

		// Outside the lock's transactions, the connection's own bound is
		// back.
		assert.Equal(t, "1min", txTimeout(t, context.Background(), db).String)
	})

	t.Run("longer bound of the connection: a frozen holder", func(t *testing.T) {
		// The holder sends nothing after the lock statement: the idle
		// bound, which PostgreSQL arms only while it is below
		// transaction_timeout, and the restarted transaction_timeout both
		// run.
		u, err := url.Parse(pgtest.Postgres(t))
		require.NoError(t, err)
		q := u.Query()
		q.Set("transaction_timeout", "1min")
		u.RawQuery = q.Encode()
		db := open(t, u.String())
		key := txlock.StringKey(uniq(t))
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		// The bound's timers start between sent and granted: the lower
		// bound counts from the one, the upper from the other. Kept, the
		// lock would be held for the connection's minute, past grab's 10s
		// lock_timeout.
		sent := time.Now()
		_, err = tx.ExecContext(ctx, txlock.LockStatement([]txlock.Key{key}, false, holdBound, txlock.FormOwnTx))
		require.NoError(t, err)
		granted := time.Now()
		lost := lostAt(t, grab(direct(t), key))
		t.Logf("a frozen holder lost the lock %v after the grant", lost.Sub(granted).Round(time.Millisecond))
		assert.GreaterOrEqual(t, lost.Sub(sent), holdBound-100*time.Millisecond)
		assert.Less(t, lost.Sub(granted), 3*time.Second, "the frozen holder kept the lock")
		var one int
		assert.Error(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one), "the server ended the session")
	})

	t.Run("shorter bound of the caller: left alone", func(t *testing.T) {
		key := txlock.StringKey(uniq(t))
		ctx := context.Background()
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		// The caller's timer starts while set_config runs: after sent, and
		// before set.
		sent := time.Now()
		_, err = tx.ExecContext(ctx, `SELECT pg_catalog.set_config('transaction_timeout', '1500ms', true)`)
		require.NoError(t, err)
		set := time.Now()
		require.NoError(t, txlock.LockTx(ctx, tx, key, txlock.WithMaxHold(5*time.Second)))
		assertTxTimeout(t, ctx, tx, v, "1500ms")
		got := grab(db, key)
		// Longer than longSleep, at no cost while the caller's bound ends
		// it at 1.5s, so that a pause of a loaded machine does not bring
		// the end of that bound near the statement's: had the hold bound
		// replaced the caller's, the lock would be held to the statement's
		// end, at least 4s after set.
		const longer = 4 * time.Second
		_, stmtErr := tx.ExecContext(context.Background(), `SELECT pg_catalog.pg_sleep(4)`)
		lost := lostAt(t, got)
		t.Logf("the caller's bound of 1.5s ended the transaction %v after it was set", lost.Sub(set).Round(time.Millisecond))
		assert.GreaterOrEqual(t, lost.Sub(sent), 1500*time.Millisecond)
		assert.Less(t, lost.Sub(set), longer-100*time.Millisecond, "the caller's own, shorter, bound was lost")
		assert.Equal(t, "25P04", txlock.SQLState(stmtErr), "%v", stmtErr)
	})
}

// A fn shorter than the bound is unaffected, directly and through
// PgBouncer, polling and waiting in the server, however many such
// transactions run in a row on the same server connections: the timer ends
// with each transaction, and the setting does not outlive it.
func TestMaxHoldHealthyFn(t *testing.T) {
	// fn takes about 0.2 s, far below the bound, so that a loaded machine
	// (a pause of a second through PgBouncer has been seen in CI) does not
	// reach it; ten runs together still outlast the server's bound.
	const bound = 1500 * time.Millisecond
	for _, via := range []string{"direct", "PgBouncer"} {
		for _, mode := range []struct {
			name string
			opts []txlock.Option
		}{
			{"polling", nil},
			{"ServerWait", []txlock.Option{txlock.WithServerWait(txlock.ServerWait{})}},
		} {
			t.Run(via+"/"+mode.name, func(t *testing.T) {
				var db *sql.DB
				if via == "direct" {
					db = direct(t)
				} else {
					db, _ = bouncer(t, "exec")
				}
				v := serverVersion(t, db)
				_, err := db.Exec(`CREATE TABLE IF NOT EXISTS maxhold_healthy (v text)`)
				require.NoError(t, err)
				key := txlock.StringKey(uniq(t))
				start := time.Now()
				const runs = 10 // together longer than the server's bound
				for i := range runs {
					val := uniq(t)
					err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
						if i == 0 {
							assertTxTimeout(t, ctx, tx, v, "1650ms")
						}
						if _, err := tx.ExecContext(ctx, `INSERT INTO maxhold_healthy VALUES ($1)`, val); err != nil {
							return err
						}
						_, err := tx.ExecContext(ctx, `SELECT pg_catalog.pg_sleep(0.2)`)
						return err
					}, append(mode.opts, txlock.WithMaxHold(bound))...)
					require.NoError(t, err, "run %d", i)
					var n int
					require.NoError(t, db.QueryRow(`SELECT count(*) FROM maxhold_healthy WHERE v = $1`, val).Scan(&n))
					assert.Equal(t, 1, n, "run %d committed", i)
				}
				assert.Greater(t, time.Since(start), bound+bound/10,
					"the runs together outlast the server's bound: a timer that outlived its transaction would have ended a later one")
				// Outside the lock's transactions the setting is back to the
				// server's default.
				tx, err := db.Begin()
				require.NoError(t, err)
				assertTxTimeout(t, context.Background(), tx, v, "0")
				require.NoError(t, tx.Commit())
			})
		}
	}
}

// The branches that set transaction_timeout reach no object through the
// search_path: every name in them is pg_catalog's (see searchpath_test.go,
// whose shadows include every function and operator they call). With a
// bound in force, on 17 and later, the branch that compares the bounds runs
// too.
func TestMaxHoldSearchPath(t *testing.T) {
	h := hostileDirect(t)
	v := serverVersion(t, h.clean)
	before := h.check(t)
	ctx := context.Background()
	opts := func(more ...txlock.Option) []txlock.Option { return append(more, txlock.WithMaxHold(holdBound)) }
	for _, c := range []struct {
		name    string
		inForce bool // a longer transaction_timeout in force first (17+)
		opts    []txlock.Option
		lockTx  bool
	}{
		{name: "WithLocks", opts: opts()},
		{name: "WithLocks ServerWait", opts: opts(txlock.WithServerWait(txlock.ServerWait{}))},
		{name: "LockTx", opts: opts(), lockTx: true},
		{name: "LockTx ServerWait", opts: opts(txlock.WithServerWait(txlock.ServerWait{})), lockTx: true},
		{name: "LockTx bound in force", opts: opts(), lockTx: true, inForce: true},
		{name: "LockTx ServerWait bound in force", opts: opts(txlock.WithServerWait(txlock.ServerWait{})), lockTx: true, inForce: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			keys := []txlock.Key{txlock.StringKey(uniq(t)), txlock.NewKeyspace(uniq(t)).Key("x")}
			if c.lockTx {
				keys = keys[:1]
			}
			check := func(ctx context.Context, tx *sql.Tx) error {
				for _, k := range keys {
					assert.Equal(t, 1, heldBy(t, h.clean, k), "%v is not held on the server", k)
				}
				assertTxTimeout(t, ctx, tx, v, boundTxTimeout)
				return nil
			}
			if !c.lockTx {
				require.NoError(t, txlock.WithLocks(ctx, h.evil, keys, check, c.opts...))
				return
			}
			tx, err := h.evil.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback() }()
			if c.inForce && hasTxTimeout(v) {
				_, err := tx.ExecContext(ctx, `SELECT pg_catalog.set_config('transaction_timeout', '1min', true)`)
				require.NoError(t, err)
			}
			require.NoError(t, txlock.LockTx(ctx, tx, keys[0], c.opts...))
			require.NoError(t, check(ctx, tx))
		})
	}
	h.noNewHits(t, before)
}

// A bound longer than the settings accept (2147483647 ms, about 24.8 days)
// is set at their largest value rather than failing the lock statement.
func TestMaxHoldLongestBound(t *testing.T) {
	db := direct(t)
	v := serverVersion(t, db)
	ran := false
	err := txlock.WithLock(context.Background(), db, txlock.StringKey(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
		ran = true
		var idle string
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('idle_in_transaction_session_timeout')`).Scan(&idle))
		assert.Equal(t, "2147483647ms", idle)
		assertTxTimeout(t, ctx, tx, v, "2147483647ms")
		return nil
	}, txlock.WithMaxHold(30*24*time.Hour))
	require.NoError(t, err)
	assert.True(t, ran)
}

// When the server's side of the hold bound ends the session before the
// client's deadline fires, the error still matches ErrHoldTimeout. Here fn
// shortens the idle bound itself, so that the server fires first for sure.
func TestMaxHoldServerFiresFirst(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', '100', true)`); err != nil {
			return err
		}
		time.Sleep(600 * time.Millisecond)
		_, err := tx.ExecContext(ctx, `SELECT 1`)
		return err
	}, txlock.WithMaxHold(30*time.Second))
	require.Error(t, err)
	assert.Equal(t, "25P03", txlock.SQLState(err), "the server ended the session: %v", err)
	assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
	assert.Zero(t, heldBy(t, db, key), "the lock went with the session")
}

// TestMaxHoldEndsCommitWithoutStandby: a bound that ends a COMMIT waiting
// for a synchronous standby reports the outcome unknown (locktest's scene).
func TestMaxHoldEndsCommitWithoutStandby(t *testing.T) {
	locktest.CommitWithoutStandby(t, func(ctx context.Context, url string, key txlock.Key, stmt string, opts ...txlock.Option) error {
		return txlock.WithLock(ctx, open(t, url), key, func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, stmt)
			return err
		}, opts...)
	})
}
