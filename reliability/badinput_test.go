package reliability_test

import (
	"context"
	"database/sql"
	"errors"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/reliability/internal/checker"
)

// badCase is one bad input: call makes the call and returns its error;
// the error must match every sentinel in is, none in not, and contain msg. fn reports
// whether the callback ran, for the cases where it must not.
type badCase struct {
	name  string
	call  func(t *testing.T, env *badEnv) error
	is    []error
	not   []error
	msg   string
	fnRan bool // fn is expected to run
	check func(t *testing.T, env *badEnv, err error)
}

// badEnv is what the cases run against.
type badEnv struct {
	db, standby, unreachable *sql.DB
	table                    string // a table fn may write to
	ran                      bool   // set by fn
	key                      txlock.Key
}

func (e *badEnv) fn(ctx context.Context, tx *sql.Tx) error {
	e.ran = true
	_, err := tx.ExecContext(ctx, `INSERT INTO `+e.table+` VALUES ('fn')`)
	return err
}

// inTx runs f in a transaction of db and rolls it back.
func inTx(t *testing.T, db *sql.DB, f func(tx *sql.Tx) error) error {
	t.Helper()
	tx, err := db.Begin()
	require.NoError(t, err)
	defer func() { _ = tx.Rollback() }()
	return f(tx)
}

// recovered runs f and returns what it panicked with, as an error.
func recovered(f func()) (err error) {
	defer func() {
		r := recover()
		if e, ok := r.(error); ok {
			err = e
		} else if r != nil {
			err = errors.New("panic: " + r.(string))
		}
	}()
	f()
	return errors.New("no panic")
}

func badCases() []badCase {
	ctx := context.Background()
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	expired, cancel2 := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	_ = cancel2
	var nilDB *sql.DB
	strategy := func(s txlock.RetryStrategy) func(t *testing.T, e *badEnv) error {
		return func(t *testing.T, e *badEnv) error {
			return txlock.WithLock(ctx, e.db, e.key, e.fn, txlock.WithRetry(s))
		}
	}
	key := func(k txlock.Key) func(t *testing.T, e *badEnv) error {
		return func(t *testing.T, e *badEnv) error { return txlock.WithLock(ctx, e.db, k, e.fn) }
	}
	opt := func(o ...txlock.Option) func(t *testing.T, e *badEnv) error {
		return func(t *testing.T, e *badEnv) error { return txlock.WithLock(ctx, e.db, e.key, e.fn, o...) }
	}
	inv, ik := txlock.ErrInvalidArgument, txlock.ErrInvalidKey
	return []badCase{
		// Nil arguments.
		{name: "nil db", call: func(t *testing.T, e *badEnv) error { return txlock.WithLock(ctx, nil, e.key, e.fn) }, is: []error{inv}, msg: "db is nil"},
		{name: "typed nil db", call: func(t *testing.T, e *badEnv) error { return txlock.WithLock(ctx, nilDB, e.key, e.fn) }, is: []error{inv}, msg: "db is nil"},
		{name: "nil db, WithLocks", call: func(t *testing.T, e *badEnv) error {
			return txlock.WithLocks(ctx, nil, []txlock.Key{e.key}, e.fn)
		}, is: []error{inv}, msg: "db is nil"},
		{name: "nil db, TryWithLock", call: func(t *testing.T, e *badEnv) error {
			_, err := txlock.TryWithLock(ctx, nilDB, e.key, e.fn)
			return err
		}, is: []error{inv}, msg: "db is nil"},
		{name: "nil tx, LockTx", call: func(t *testing.T, e *badEnv) error { return txlock.LockTx(ctx, nil, e.key) }, is: []error{inv}, msg: "tx is nil"},
		{name: "nil tx, TryLockTx", call: func(t *testing.T, e *badEnv) error {
			_, err := txlock.TryLockTx(ctx, nil, e.key)
			return err
		}, is: []error{inv}, msg: "tx is nil"},
		{name: "nil fn", call: func(t *testing.T, e *badEnv) error { return txlock.WithLock(ctx, e.db, e.key, nil) }, is: []error{inv}, msg: "fn is nil"},
		{name: "nil fn, WithLocks", call: func(t *testing.T, e *badEnv) error {
			return txlock.WithLocks(ctx, e.db, []txlock.Key{e.key}, nil)
		}, is: []error{inv}, msg: "fn is nil"},
		{name: "nil fn, TryWithLocks", call: func(t *testing.T, e *badEnv) error {
			_, err := txlock.TryWithLocks(ctx, e.db, []txlock.Key{e.key}, nil)
			return err
		}, is: []error{inv}, msg: "fn is nil"},
		{name: "nil key list", call: func(t *testing.T, e *badEnv) error { return txlock.WithLocks(ctx, e.db, nil, e.fn) }, is: []error{inv}, msg: "no keys"},
		{name: "empty key list", call: func(t *testing.T, e *badEnv) error { return txlock.WithLocks(ctx, e.db, []txlock.Key{}, e.fn) }, is: []error{inv}, msg: "no keys"},

		// Contexts that already ended.
		{name: "cancelled ctx", call: func(t *testing.T, e *badEnv) error { return txlock.WithLock(cancelled, e.db, e.key, e.fn) },
			is: []error{context.Canceled}, msg: "lock wait canceled", not: []error{txlock.ErrLockTimeout}},
		{name: "expired ctx", call: func(t *testing.T, e *badEnv) error { return txlock.WithLock(expired, e.db, e.key, e.fn) },
			is: []error{txlock.ErrLockTimeout, context.DeadlineExceeded}, msg: "not granted after 0 attempts"},
		{name: "cancelled ctx, TryWithLock", call: func(t *testing.T, e *badEnv) error {
			_, err := txlock.TryWithLock(cancelled, e.db, e.key, e.fn)
			return err
		}, is: []error{context.Canceled}, msg: "lock wait canceled", not: []error{txlock.ErrLockTimeout}},
		{name: "cancelled ctx, LockTx", call: func(t *testing.T, e *badEnv) error {
			return inTx(t, e.db, func(tx *sql.Tx) error { return txlock.LockTx(cancelled, tx, e.key) })
		}, is: []error{context.Canceled}, msg: "lock wait canceled", not: []error{txlock.ErrLockTimeout}},

		// Options.
		{name: "zero timeout", call: opt(txlock.WithTimeout(0)), is: []error{inv}, msg: "WithTimeout needs a positive duration, got 0s"},
		{name: "negative timeout", call: opt(txlock.WithTimeout(-time.Second)), is: []error{inv}, msg: "WithTimeout needs a positive duration, got -1s"},
		{name: "zero max hold", call: opt(txlock.WithMaxHold(0)), is: []error{inv}, msg: "WithMaxHold needs a positive duration, got 0s"},
		{name: "negative max hold", call: opt(txlock.WithMaxHold(-time.Millisecond)), is: []error{inv}, msg: "WithMaxHold needs a positive duration"},
		{name: "negative serialization retries", call: opt(txlock.WithSerializationRetries(-1)), is: []error{inv}, msg: "WithSerializationRetries needs n >= 0"},
		{name: "nil option", call: opt(nil), is: []error{inv}, msg: "nil Option"},
		{name: "nil strategy", call: opt(txlock.WithRetry(nil)), is: []error{inv}, msg: "WithRetry needs a strategy"},
		{name: "LockTx with WithTxOptions", call: func(t *testing.T, e *badEnv) error {
			return inTx(t, e.db, func(tx *sql.Tx) error { return txlock.LockTx(ctx, tx, e.key, txlock.WithTxOptions(nil)) })
		}, is: []error{inv}, msg: "WithTxOptions does not apply"},
		{name: "LockTx with zero timeout", call: func(t *testing.T, e *badEnv) error {
			return inTx(t, e.db, func(tx *sql.Tx) error { return txlock.LockTx(ctx, tx, e.key, txlock.WithTimeout(0)) })
		}, is: []error{inv}, msg: "WithTimeout needs a positive duration"},

		// Backoff values and strategy bounds.
		{name: "exponential: negative min", call: strategy(txlock.ExponentialBackoff{Min: -time.Millisecond}), is: []error{inv}, msg: "must not be negative"},
		{name: "exponential: negative max", call: strategy(txlock.ExponentialBackoff{Max: -time.Millisecond}), is: []error{inv}, msg: "must not be negative"},
		{name: "exponential: min > max", call: strategy(txlock.ExponentialBackoff{Min: time.Second, Max: time.Millisecond}), is: []error{inv}, msg: "Min 1s is greater than Max 1ms"},
		{name: "exponential: min > default max", call: strategy(txlock.ExponentialBackoff{Min: time.Second}), is: nil, fnRan: true},
		{name: "constant: zero interval", call: strategy(txlock.ConstantBackoff{}), is: []error{inv}, msg: "Interval must be positive, got 0s"},
		{name: "constant: negative interval", call: strategy(txlock.ConstantBackoff{Interval: -time.Second}), is: []error{inv}, msg: "Interval must be positive"},
		{name: "constant: negative jitter", call: strategy(txlock.ConstantBackoff{Interval: time.Millisecond, Jitter: -1}), is: []error{inv}, msg: "Jitter must not be negative"},
		{name: "linear: zero step", call: strategy(txlock.LinearBackoff{Max: time.Second}), is: []error{inv}, msg: "Step must be positive"},
		{name: "linear: zero max", call: strategy(txlock.LinearBackoff{Step: time.Millisecond}), is: []error{inv}, msg: "Max must be positive"},
		{name: "linear: step > max", call: strategy(txlock.LinearBackoff{Step: 2 * time.Second, Max: time.Second}), is: []error{inv}, msg: "Step 2s is greater than Max 1s"},
		{name: "linear: negative jitter", call: strategy(txlock.LinearBackoff{Step: 1, Max: 2, Jitter: -1}), is: []error{inv}, msg: "Jitter must not be negative"},
		{name: "server wait: negative window", call: opt(txlock.WithServerWait(txlock.ServerWait{Window: -time.Second})), is: []error{inv}, msg: "Window must be zero"},
		{name: "server wait: sub-millisecond window", call: opt(txlock.WithServerWait(txlock.ServerWait{Window: time.Microsecond})), is: []error{inv}, msg: "at least 1ms"},
		{name: "server wait: negative pause", call: opt(txlock.WithServerWait(txlock.ServerWait{Pause: -time.Second})), is: []error{inv}, msg: "Pause must not be negative"},
		{name: "server wait with a retry strategy", call: opt(txlock.WithServerWait(txlock.ServerWait{}), txlock.WithRetry(txlock.NoRetry)), is: []error{inv}, msg: "WithServerWait cannot be combined with a WithRetry strategy other than DefaultRetry"},

		// Keys.
		{name: "zero key", call: key(txlock.Key{}), is: []error{ik}, msg: "zero Key"},
		{name: "empty key name", call: key(txlock.StringKey("")), is: []error{ik}, msg: "key name is empty"},
		{name: "empty name in keyspace", call: key(txlock.NewKeyspace("svc").Key("")), is: []error{ik}, msg: "key name is empty"},
		{name: "empty keyspace name", call: key(txlock.NewKeyspace("").Key("a")), is: []error{ik}, msg: "keyspace name is empty"},
		{name: "empty keyspace name, ID", call: key(txlock.NewKeyspace("").ID(1)), is: []error{ik}, msg: "keyspace name is empty"},
		{name: "invalid UTF-8 key", call: key(txlock.StringKey("bad\xff")), is: []error{ik}, msg: "not valid UTF-8"},
		{name: "truncated UTF-8 key", call: key(txlock.StringKey("\xc3")), is: []error{ik}, msg: "not valid UTF-8"},
		{name: "invalid UTF-8 keyspace", call: key(txlock.NewKeyspace("\xfe").Key("a")), is: []error{ik}, msg: "not valid UTF-8"},
		{name: "NUL in key", call: key(txlock.StringKey("a\x00b")), is: []error{ik}, msg: "NUL byte"},
		{name: "NUL in keyspace", call: key(txlock.NewKeyspace("\x00").Key("a")), is: []error{ik}, msg: "NUL byte"},
		{name: "one bad key of many", call: func(t *testing.T, e *badEnv) error {
			return txlock.WithLocks(ctx, e.db, []txlock.Key{e.key, txlock.StringKey("\xff")}, e.fn)
		}, is: []error{ik}, msg: "not valid UTF-8"},
		{name: "bad key, LockTx", call: func(t *testing.T, e *badEnv) error {
			return inTx(t, e.db, func(tx *sql.Tx) error { return txlock.LockTx(ctx, tx, txlock.StringKey("")) })
		}, is: []error{ik}, msg: "key name is empty"},
		{name: "1 MB key name", fnRan: true, call: func(t *testing.T, e *badEnv) error {
			name := strings.Repeat("ключ", 1<<18) // 1 MiB of UTF-8
			k := txlock.StringKey(name)
			require.NoError(t, k.Err())
			var want int64
			require.NoError(t, e.db.QueryRow(`SELECT ('x' || left(encode(sha256(convert_to($1::text, 'UTF8')), 'hex'), 16))::bit(64)::bigint`, name).Scan(&want))
			got, _ := k.Int64()
			assert.Equal(t, want, got, "the key matches the server's SQL")
			assert.Less(t, len(k.String()), 200, "String stays short")
			return txlock.WithLock(ctx, e.db, k, func(ctx context.Context, tx *sql.Tx) error {
				pids, err := checker.HeldBy(ctx, e.db, k)
				require.NoError(t, err)
				assert.Len(t, pids, 1, "the lock is held")
				return e.fn(ctx, tx)
			})
		}},

		// fn misbehaving.
		{name: "fn commits", fnRan: true, call: func(t *testing.T, e *badEnv) error {
			return txlock.WithLock(ctx, e.db, e.key, func(ctx context.Context, tx *sql.Tx) error {
				_ = e.fn(ctx, tx)
				return tx.Commit()
			})
		}, is: []error{txlock.ErrFnEndedTx}, msg: "fn ended the lock's transaction itself"},
		{name: "fn rolls back", fnRan: true, call: func(t *testing.T, e *badEnv) error {
			return txlock.WithLock(ctx, e.db, e.key, func(ctx context.Context, tx *sql.Tx) error {
				_ = e.fn(ctx, tx)
				return tx.Rollback()
			})
		}, is: []error{txlock.ErrFnEndedTx}, msg: "fn ended the lock's transaction itself"},
		{name: "fn rolls back and fails", fnRan: true, call: func(t *testing.T, e *badEnv) error {
			return txlock.WithLock(ctx, e.db, e.key, func(ctx context.Context, tx *sql.Tx) error {
				_ = e.fn(ctx, tx)
				_ = tx.Rollback()
				return errSentinel
			})
		}, is: []error{txlock.ErrFnEndedTx, errSentinel}, msg: "sentinel"},
		{name: "fn panics with nil", fnRan: true, call: func(t *testing.T, e *badEnv) error {
			return recovered(func() {
				_ = txlock.WithLock(ctx, e.db, e.key, func(ctx context.Context, tx *sql.Tx) error {
					_ = e.fn(ctx, tx)
					panic(nil)
				})
			})
		}, check: func(t *testing.T, e *badEnv, err error) {
			var pn *runtime.PanicNilError
			assert.ErrorAs(t, err, &pn, "panic(nil) reaches the caller")
		}},
		{name: "fn panics", fnRan: true, call: func(t *testing.T, e *badEnv) error {
			return recovered(func() {
				_ = txlock.WithLock(ctx, e.db, e.key, func(ctx context.Context, tx *sql.Tx) error {
					_ = e.fn(ctx, tx)
					panic("boom")
				})
			})
		}, msg: "panic: boom"},

		// Servers that cannot serve a lock.
		{name: "standby", call: func(t *testing.T, e *badEnv) error {
			return txlock.WithLock(ctx, e.standby, e.key, e.fn, txlock.WithTxOptions(&sql.TxOptions{ReadOnly: true}))
		}, is: []error{txlock.ErrStandby}, msg: "hot standby"},
		{name: "standby, TryLockTx", call: func(t *testing.T, e *badEnv) error {
			return inTx(t, e.standby, func(tx *sql.Tx) error { _, err := txlock.TryLockTx(ctx, tx, e.key); return err })
		}, is: []error{txlock.ErrStandby}, msg: "hot standby"},
		{name: "unreachable", call: func(t *testing.T, e *badEnv) error { return txlock.WithLock(ctx, e.unreachable, e.key, e.fn) },
			is: []error{syscall.ECONNREFUSED}, msg: "txlock: begin", check: func(t *testing.T, e *badEnv, err error) {
				assert.NotErrorIs(t, err, txlock.ErrLockTimeout, "a refused connection is not a busy lock")
				assert.Equal(t, checker.ClassConnection, checker.Classify(err))
			}},
		{name: "unreachable, TryWithLock", call: func(t *testing.T, e *badEnv) error {
			_, err := txlock.TryWithLock(ctx, e.unreachable, e.key, e.fn)
			return err
		}, is: []error{syscall.ECONNREFUSED}, msg: "txlock: begin"},
	}
}

var errSentinel = errors.New("sentinel")

// TestBadInputLeavesNothingBehind runs every bad input through the API
// against real servers. Each gets an error that matches its sentinel and
// names the problem, fn does not run when it must not, nothing fn wrote
// survives a failed call, and nothing is left held or leaked afterwards.
func TestBadInputLeavesNothingBehind(t *testing.T) {
	pg := pgtest.Postgres(t)
	sb := pgtest.Standby(t)
	leaks := newLeaks()
	admin := pool(t, pg, 2)
	env := &badEnv{
		db:          pool(t, pg, 4),
		standby:     pool(t, sb, 2),
		unreachable: pool(t, "postgres://txlock@127.0.0.1:1/postgres?sslmode=disable&connect_timeout=2", 2),
		key:         txlock.StringKey("bad-input/" + time.Now().String()),
		table:       "bad_input_" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "_"),
	}
	_, err := admin.Exec(`CREATE TABLE ` + env.table + ` (v text)`)
	require.NoError(t, err)
	cases := badCases()
	// Per case: no goroutine beyond those of the pools opened above.
	perCase := newLeaks()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			env.ran = false
			_, err := admin.Exec(`TRUNCATE ` + env.table)
			require.NoError(t, err)
			err = tc.call(t, env)
			t.Logf("%v", err)
			if len(tc.is) == 0 && tc.msg == "" && tc.check == nil {
				require.NoError(t, err)
			}
			for _, want := range tc.is {
				assert.ErrorIs(t, err, want)
			}
			for _, unwanted := range tc.not {
				assert.NotErrorIs(t, err, unwanted)
			}
			if tc.msg != "" {
				assert.ErrorContains(t, err, tc.msg)
			}
			if tc.check != nil {
				tc.check(t, env, err)
			}
			assert.Equal(t, tc.fnRan, env.ran, "whether fn ran")
			var rows int
			require.NoError(t, admin.QueryRow(`SELECT count(*) FROM `+env.table).Scan(&rows))
			if err != nil && !errors.Is(err, txlock.ErrFnEndedTx) || tc.name == "fn rolls back" {
				assert.Zero(t, rows, "a failed call must leave nothing written")
			}
			// Nothing held, nothing in use, nothing running.
			require.NoError(t, checker.NoAdvisoryLocks(admin, 5*time.Second))
			for _, db := range []*sql.DB{env.db, env.standby, env.unreachable} {
				require.NoError(t, checker.PoolIdle(db, 5*time.Second))
			}
			require.NoError(t, perCase.Goroutines(5*time.Second))
		})
	}
	_, err = admin.Exec(`DROP TABLE ` + env.table)
	require.NoError(t, err)
	assert.Zero(t, env.unreachable.Stats().OpenConnections)
	leaks.RequireNone(t, admin, env.db, env.standby, env.unreachable)
	figures(t, "bad_inputs=%d", len(cases))
}
