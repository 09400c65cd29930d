package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/bsm/redislock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/lockstmt"
	"github.com/txlock/txlock/pgxlock"
)

// env is what an implementation runs against in one measurement.
type env struct {
	db    *sql.DB       // the pool (direct, or through PgBouncer)
	pgx   *pgxpool.Pool // a pgx pool on the same URL, for pgxlock and the pgx-native references
	stmts *counter      // for statements sent below pgx's tracer
	rdb   *redis.Client // for redislock
	locks *redislock.Client
}

// work is the guarded work: what fn does once the lock is held, in a
// database/sql transaction and, for pgxlock and the pgx-native references,
// on a pgx connection in a transaction.
type work struct {
	sql func(ctx context.Context, tx *sql.Tx, id int) error
	pgx func(ctx context.Context, q pgxQuerier, id int) error
}

// pgxQuerier is what the pgx form of fn needs: a pgx.Tx, or a pgx
// connection on which the transaction was begun by hand.
type pgxQuerier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// errBusy is a reference implementation's answer when its one try at the
// lock finds it held: these try once and do not wait, being measured only
// where nobody contends.
var errBusy = errors.New("lock busy")

// impl acquires the lock named by id, runs w in a transaction, and reports
// when the lock was granted (the end of the wait).
type impl struct {
	name string
	// direct is false for implementations that are unsafe behind PgBouncer
	// in transaction mode (session locks), which are then not run there.
	pgbouncerSafe bool
	// perWorker prepares per-worker state; nil means none.
	perWorker func(ctx context.Context, e *env) (workerImpl, error)
	run       func(ctx context.Context, e *env, id int, w work, granted func()) error
}

// workerImpl is an implementation bound to one worker's own resources.
type workerImpl interface {
	run(ctx context.Context, e *env, id int, w work, granted func()) error
	close()
}

// lockKey is the txlock key of row id.
func lockKey(id int) txlock.Key { return txlock.StringKey("bench:row:" + strconv.Itoa(id)) }

// lockInt64 is the bigint of lockKey(id).
func lockInt64(id int) int64 {
	n, _ := lockKey(id).Int64()
	return n
}

// lockArgs is the same key as advisory lock function arguments, for the
// alternatives that send their own statements. The literal is quoted
// because the magnitude of math.MinInt64 does not fit a bigint literal.
func lockArgs(id int) string {
	return "'" + strconv.FormatInt(lockInt64(id), 10) + "'::int8"
}

// inTx runs w in a plain transaction and commits. lock, if not nil, runs
// first in the same transaction: it is the way the implementation takes its
// lock, and w runs once it returns.
func inTx(ctx context.Context, db interface {
	BeginTx(context.Context, *sql.TxOptions) (*sql.Tx, error)
}, id int, w work, granted func(), lock func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if lock != nil {
		if err := lock(tx); err != nil {
			return err
		}
	}
	if granted != nil {
		granted()
	}
	if err := w.sql(ctx, tx, id); err != nil {
		return err
	}
	return tx.Commit()
}

// txlockImpl is txlock.WithLock with the given options.
func txlockImpl(name string, opts ...txlock.Option) impl {
	opts = append([]txlock.Option{txlock.WithTimeout(60 * time.Second)}, opts...)
	return impl{name: name, pgbouncerSafe: true,
		run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
			return txlock.WithLock(ctx, e.db, lockKey(id), func(ctx context.Context, tx *sql.Tx) error {
				granted()
				return w.sql(ctx, tx, id)
			}, opts...)
		}}
}

// pgxlockImpl is pgxlock.WithLock on the env's pgxpool, with the same
// options as txlockImpl: fn is the pgx form of the work, in the pgx.Tx of
// the lock.
func pgxlockImpl(name string, opts ...txlock.Option) impl {
	opts = append([]txlock.Option{txlock.WithTimeout(60 * time.Second)}, opts...)
	return impl{name: name, pgbouncerSafe: true,
		run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
			return pgxlock.WithLock(ctx, e.pgx, lockKey(id), func(ctx context.Context, tx pgx.Tx) error {
				granted()
				return w.pgx(ctx, tx, id)
			}, opts...)
		}}
}

// plainTx is the baseline: the same transaction with no lock.
var plainTx = impl{name: "plain-tx", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inTx(ctx, e.db, id, w, granted, nil)
	}}

// plainTxRoundTrip is the plain transaction plus one SELECT 1: the floor of
// any lock that costs one round trip more than no lock, measured rather
// than assumed.
var plainTxRoundTrip = impl{name: "plain-tx+1rt", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inTx(ctx, e.db, id, w, granted, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "SELECT 1")
			return err
		})
	}}

// plainTxLockStmt is the plain transaction plus txlock's own lock
// statement (lockstmt.Exclusive, the one WithLock sends), sent by hand: the
// server's share of txlock's cost, without any of its client-side work
// (options, timeout, local queue, retry loop). The statement returns one
// row when the lock is granted.
var plainTxLockStmt = impl{name: "plain-tx+lock-stmt", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inTx(ctx, e.db, id, w, granted, func(tx *sql.Tx) error {
			res, err := tx.ExecContext(ctx, lockstmt.Exclusive(lockInt64(id)))
			if err != nil {
				return err
			}
			if n, err := res.RowsAffected(); err != nil || n != 1 {
				return fmt.Errorf("lock statement: %d rows, %v", n, err)
			}
			return nil
		})
	}}

// plainTxBareLock is the plain transaction plus the bare lock function,
// SELECT pg_catalog.pg_try_advisory_xact_lock(k), sent by hand with the
// simple protocol as WithLock sends its statement: the floor of any lock
// over database/sql, which cannot put the lock into BEGIN's round trip. A
// false result (the lock is held) returns errBusy, and inTx rolls back.
var plainTxBareLock = impl{name: "plain-tx+bare-lock", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inTx(ctx, e.db, id, w, granted, func(tx *sql.Tx) error {
			var ok bool
			if err := tx.QueryRowContext(ctx, bareLock(id), pgx.QueryExecModeSimpleProtocol).Scan(&ok); err != nil {
				return err
			}
			if !ok {
				return errBusy
			}
			return nil
		})
	}}

// bareLock is the bare lock statement of row id.
func bareLock(id int) string {
	return "SELECT pg_catalog.pg_try_advisory_xact_lock(" + lockArgs(id) + ")"
}

// plainPgx is the plain transaction in pgx itself (a pgx.Tx on a pgxpool),
// around the same fn: what leaving database/sql saves.
var plainPgx = impl{name: "plain-pgx", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inPgxTx(ctx, e.pgx, id, w, granted)
	}}

// inPgxTx runs the pgx form of w in a plain pgx transaction on pool and
// commits.
func inPgxTx(ctx context.Context, pool *pgxpool.Pool, id int, w work, granted func()) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if granted != nil {
		granted()
	}
	if err := w.pgx(ctx, tx, id); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// plainPgxBareLockInBegin is the floor of a pgx-native lock: BEGIN and the
// bare lock function sent as one simple-protocol query without arguments
// (one round trip, the lock's answer in its second result), then fn, then
// COMMIT; as many round trips as a plain transaction. A false result rolls
// the transaction back and returns errBusy. pgx's Query would return only
// the first result (BEGIN's), so the query goes through pgconn, below pgx's
// tracer: its two statements are counted here.
var plainPgxBareLockInBegin = impl{name: "plain-pgx+bare-lock-in-begin", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		c, err := e.pgx.Acquire(ctx)
		if err != nil {
			return err
		}
		// Release closes a connection that is not idle, so a transaction
		// left open by an error below never returns to the pool; the
		// ROLLBACKs keep the connection when they can.
		defer c.Release()
		conn := c.Conn()
		rollback := func(err error) error {
			if conn.PgConn().TxStatus() != 'I' && !conn.IsClosed() {
				if _, rerr := conn.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil {
					return errors.Join(err, rerr)
				}
			}
			return err
		}
		e.stmts.n.Add(2)
		res, err := conn.PgConn().Exec(ctx, "BEGIN; "+bareLock(id)).ReadAll()
		if err != nil {
			return rollback(err)
		}
		if len(res) != 2 || len(res[1].Rows) != 1 || len(res[1].Rows[0]) != 1 {
			return rollback(fmt.Errorf("BEGIN; lock: unexpected results %v", res))
		}
		if string(res[1].Rows[0][0]) != "t" {
			return rollback(errBusy)
		}
		granted()
		if err := w.pgx(ctx, conn, id); err != nil {
			return rollback(err)
		}
		tag, err := conn.Exec(ctx, "COMMIT")
		if err != nil {
			return rollback(err)
		}
		if tag.String() != "COMMIT" { // an aborted transaction's COMMIT answers ROLLBACK
			return fmt.Errorf("COMMIT answered %q", tag.String())
		}
		return nil
	}}

// forUpdate locks the row itself with SELECT … FOR UPDATE.
var forUpdate = impl{name: "select-for-update", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inTx(ctx, e.db, id, w, granted, func(tx *sql.Tx) error {
			var one int
			return tx.QueryRowContext(ctx, `SELECT 1 FROM bench_rows WHERE id = $1 FOR UPDATE`, id).Scan(&one)
		})
	}}

// blocking is BEGIN; pg_advisory_xact_lock (waits in the server's queue);
// fn; COMMIT: the fairness and handoff ideal, which pins a server
// connection per waiter.
var blocking = impl{name: "pg-blocking", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inTx(ctx, e.db, id, w, granted, func(tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock("+lockArgs(id)+")")
			return err
		})
	}}

// pollHeldTx polls pg_try_advisory_xact_lock every 50 ms + 0–20 ms jitter
// inside one transaction, which it holds (with its connection) throughout.
var pollHeldTx = impl{name: "poll-50ms-held-tx", pgbouncerSafe: true,
	run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inTx(ctx, e.db, id, w, granted, func(tx *sql.Tx) error {
			stmt := "SELECT pg_try_advisory_xact_lock(" + lockArgs(id) + ")"
			for {
				var ok bool
				if err := tx.QueryRowContext(ctx, stmt).Scan(&ok); err != nil {
					return err
				}
				if ok {
					return nil
				}
				if err := sleepCtx(ctx, 50*time.Millisecond+rand.N(20*time.Millisecond+1)); err != nil {
					return err
				}
			}
		})
	}}

// sessionLock holds a dedicated *sql.Conn per worker and brackets the
// transaction with pg_advisory_lock / pg_advisory_unlock. It is not run
// behind PgBouncer in transaction mode, where the unlock may reach another
// server connection than the lock.
var sessionLock = impl{name: "session-lock-conn", pgbouncerSafe: false,
	perWorker: func(ctx context.Context, e *env) (workerImpl, error) {
		c, err := e.db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		return &sessionWorker{conn: c}, nil
	}}

type sessionWorker struct{ conn *sql.Conn }

func (s *sessionWorker) run(ctx context.Context, e *env, id int, w work, granted func()) error {
	if _, err := s.conn.ExecContext(ctx, "SELECT pg_advisory_lock("+lockArgs(id)+")"); err != nil {
		return err
	}
	err := inTx(ctx, s.conn, id, w, granted, nil)
	var ok bool
	if uerr := s.conn.QueryRowContext(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock("+lockArgs(id)+")").Scan(&ok); uerr != nil {
		return errors.Join(err, uerr)
	} else if !ok {
		return errors.Join(err, errors.New("pg_advisory_unlock: lock was not held"))
	}
	return err
}

func (s *sessionWorker) close() { _ = s.conn.Close() }

// redisLock takes a bsm/redislock lock (ExponentialBackoff between tries),
// runs the same database/sql transaction, and releases the lock.
func redisLock(min, max time.Duration) impl {
	return redisLocked("redislock+tx", min, max, func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inTx(ctx, e.db, id, w, granted, nil)
	})
}

// redisLockPgx is redisLock with the transaction in pgx itself, as
// plain-pgx runs it: the like-for-like alternative to pgxlock.
func redisLockPgx(min, max time.Duration) impl {
	return redisLocked("redislock+pgx-tx", min, max, func(ctx context.Context, e *env, id int, w work, granted func()) error {
		return inPgxTx(ctx, e.pgx, id, w, granted)
	})
}

// redisLocked is the redislock implementation named name: tx runs under
// the Redis lock of row id.
func redisLocked(name string, min, max time.Duration, tx func(ctx context.Context, e *env, id int, w work, granted func()) error) impl {
	return impl{name: name, pgbouncerSafe: true,
		run: func(ctx context.Context, e *env, id int, w work, granted func()) error {
			lctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			l, err := e.locks.Obtain(lctx, "bench:row:"+strconv.Itoa(id), 30*time.Second,
				&redislock.Options{RetryStrategy: redislock.ExponentialBackoff(min, max)})
			if err != nil {
				return err
			}
			err = tx(ctx, e, id, w, granted)
			return errors.Join(err, l.Release(context.WithoutCancel(ctx)))
		}}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
