package txlock

import (
	"context"
	"database/sql"
	"fmt"
	"slices"

	"github.com/txlock/txlock/driver"
)

// WithLock takes the exclusive transaction-scoped advisory lock key, then runs
// fn in the same transaction, and commits.
//
// Each attempt begins a transaction on db and runs, in one round trip,
// pg_try_advisory_xact_lock together with pg_is_in_recovery(). If the lock is
// busy, the transaction is rolled back at once, which returns its connection
// to the pool (and, behind PgBouncer in transaction mode, its server
// connection), and WithLock waits before trying again. By default
// (DefaultRetry) the first caller of the process's local queue waits in the
// server's lock queue, in windows of up to DefaultServerWaitWindow, and
// sleeps between them; WithRetry with another strategy polls only, and
// WithServerWait waits in the server on every attempt. Callers of this
// process that wait for the same keys on the same db queue behind each other
// locally, in FIFO order, and the lock passes between them without a sleep:
// see the package documentation's "Local queues". How a call waits, and when
// the default polls instead, is told in "How waiting works":
// https://github.com/txlock/txlock/blob/main/docs/waiting.md
//
// The wait ends at the earlier of the context's deadline and WithTimeout
// (DefaultTimeout), with an error that matches ErrLockTimeout.
//
// Once the lock is granted, fn runs with the transaction:
//   - fn returns nil: the transaction commits, and a commit error is returned
//     (ErrCommitFailed);
//   - fn returns an error: the transaction rolls back, and that error is
//     returned, joined with ErrFnEndedTx if fn also ended the transaction
//     itself, or with ErrHoldTimeout if fn outlived WithMaxHold (errors.Is
//     and errors.As still find fn's error);
//   - fn panics: the transaction rolls back, and the panic continues.
//
// The lock is released by that commit or rollback, and no sooner, so every
// write fn makes in tx is visible to the next holder. fn must not commit or
// roll back tx itself (ErrFnEndedTx). Writes fn makes elsewhere (another
// database, a queue) escape the lock: see FenceToken.
//
// A server in recovery is refused with ErrStandby. Invalid arguments are
// reported with ErrInvalidArgument or ErrInvalidKey before the database is
// touched.
func WithLock(ctx context.Context, db DB, key Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	_, err := startCall(ctx, db, fn, []Key{key}, false, opts)
	return err
}

// WithLocks is WithLock for several keys, taken all or nothing: every
// attempt asks for all of them, in canonical order, in one statement, and a
// partial grant is rolled back with the attempt. It never deadlocks.
func WithLocks(ctx context.Context, db DB, keys []Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	_, err := startCall(ctx, db, fn, keys, false, opts)
	return err
}

// TryWithLock makes one attempt at key. If the lock is busy it returns
// (false, nil) without running fn: the shape for singleton jobs that skip a
// run when another instance has it. Otherwise it runs fn as WithLock does and
// returns (true, the result). An error that is not about the lock, such as a
// failed connection, is returned with false. It never queues or waits, with
// any option.
func TryWithLock(ctx context.Context, db DB, key Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return startCall(ctx, db, fn, []Key{key}, true, opts)
}

// TryWithLocks is TryWithLock for several keys, all or nothing.
func TryWithLocks(ctx context.Context, db DB, keys []Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return startCall(ctx, db, fn, keys, true, opts)
}

// call is the state of one call of the WithLock family, database/sql's
// or a driver's (DriverLock), in one allocation.
type call struct {
	c   config
	ev  events
	own ownTx          // database/sql's attempts
	drv driverAcquirer // a driver's
	p   plan
	t   ticket
	st0 lockState // the first round's fn context
	one [1]Key
}

// startCall locks keys with database/sql's attempts on db, and runs fn
// (see WithLock).
func startCall(ctx context.Context, db DB, fn func(context.Context, *sql.Tx) error, keys []Key, try bool, opts []Option) (acquired bool, err error) {
	cl := &call{}
	cl.own = ownTx{c: &cl.c, db: db, fn: fn}
	t, err := cl.prepare(ctx, &cl.own, keys, try, opts)
	if err != nil {
		return false, err
	}
	return lockLoop(ctx, &cl.c, cl.c.waitMode(try), &cl.p, &cl.own, t, &cl.st0)
}

// DriverLock runs a call of the WithLock family whose attempts a driver
// makes (package driver): WithLock, or for several keys, taken all or
// nothing, WithLocks; with try, TryWithLock or TryWithLocks. It is how a
// driver package such as pgxlock reuses txlock's lock loop, with the same
// options, local queues, events, fencing tokens and errors; users call the
// driver package's functions. keys and opts are checked as WithLock checks
// them, before a's first attempt; a single key's slice is not kept.
func DriverLock(ctx context.Context, a driver.Acquirer, keys []Key, try bool, opts ...Option) (acquired bool, err error) {
	cl := &call{}
	cl.drv = driverAcquirer{a: a, c: &cl.c}
	t, err := cl.prepare(ctx, &cl.drv, keys, try, opts)
	if err != nil {
		return false, err
	}
	return lockLoop(ctx, &cl.c, cl.c.waitMode(try), &cl.p, &cl.drv, t, &cl.st0)
}

// prepare is the setup of every call of the WithLock family, database/sql's
// and a driver's, before its lock loop: it reads opts, checks the call's
// arguments (a.check) and keys, plans a's attempts, and returns the call's
// ticket for its local queue, or nil if it does not queue. A single key's
// slice is not kept.
func (cl *call) prepare(ctx context.Context, a source, keys []Key, try bool, opts []Option) (*ticket, error) {
	c := &cl.c
	if err := c.init(opts, false); err != nil {
		return nil, err
	}
	if err := a.check(); err != nil {
		return nil, err
	}
	held, err := cl.checkKeys(keys)
	if err != nil {
		return nil, err
	}
	cl.st0.lock = Lock{Keys: held, Shared: c.shared, Held: true, Slots: c.slots}
	locked, first, err := c.semaphoreKeys(held) // for a semaphore, its slots' keys
	if err != nil {
		return nil, err
	}
	if err := a.plan(&cl.p, locked, first, ""); err != nil {
		return nil, err
	}
	cl.ev.start(c.obs, ctx)
	cl.st0.ev = cl.ev.orNil()
	if try || c.shared {
		return nil, nil
	}
	h := a.queueHandle()
	if h == nil {
		return nil, nil
	}
	cl.t.key = queueKey{handle: h, stmt: cl.p.queueStmt(), serverWait: c.serverWait != nil, slots: c.slots}
	return &cl.t, nil
}

// checkKeys validates keys, and returns them as the call keeps them: a
// single key in cl.one, several sorted, without duplicates, in a slice of
// their own.
func (cl *call) checkKeys(keys []Key) ([]Key, error) {
	if len(keys) != 1 {
		return canonicalKeys(keys)
	}
	if err := keys[0].Err(); err != nil {
		return nil, err
	}
	cl.one[0] = keys[0]
	return cl.one[:], nil
}

// canonicalKeys validates keys and returns them sorted, without duplicates.
func canonicalKeys(keys []Key) ([]Key, error) {
	if len(keys) == 0 {
		return nil, fmt.Errorf("%w: no keys to lock", ErrInvalidArgument)
	}
	for _, k := range keys {
		if err := k.Err(); err != nil {
			return nil, err
		}
	}
	if len(keys) == 1 {
		return []Key{keys[0]}, nil
	}
	out := slices.Clone(keys)
	slices.SortFunc(out, compareKeys)
	out = slices.CompactFunc(out, func(x, y Key) bool { return compareKeys(x, y) == 0 })
	if len(out) > MaxKeys {
		return nil, fmt.Errorf("%w: %d distinct keys in one call, more than MaxKeys (%d): each takes a slot of the server's shared lock table, which every session shares; lock a coarser key, or split the work", ErrInvalidArgument, len(out), MaxKeys)
	}
	return out, nil
}

// MaxKeys is the most distinct keys one call may lock (WithLocks,
// TryWithLocks, and their pgxlock and sqlxlock forms); a call with more is
// refused with ErrInvalidArgument before the server is touched. (LockTx
// takes one key a call: a caller's transaction that calls it many times
// takes that many locks, unbounded.)
//
// It is a constant, not read from the server, so that the check costs no
// round trip. Every lock a transaction holds takes a slot of the server's
// shared lock table, which has room for about max_locks_per_transaction ×
// (max_connections + max_prepared_transactions) locks in all sessions
// together: 64 × 100 = 6,400 on a server with the default settings. When it
// is full, every session's lock requests fail, table locks included, with
// SQLSTATE 53200 (ErrLockTableFull). MaxKeys keeps one call to about a sixth
// of that default table.
const MaxKeys = 1000
