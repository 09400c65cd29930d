package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Beginner is what WithLock needs of a database: *sql.DB, *sql.Conn and
// *sqlx.DB all satisfy it.
type Beginner interface {
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

var (
	_ Beginner = (*sql.DB)(nil)
	_ Beginner = (*sql.Conn)(nil)
)

// Errors returned by this package. Match them with errors.Is.
var (
	// ErrLockTimeout: the lock was not granted before the deadline, or the
	// context ended while waiting. The error is a *LockTimeoutError.
	ErrLockTimeout = errors.New("txlock: lock wait timed out")

	// ErrStandby: the server is a hot standby (pg_is_in_recovery() is true).
	// An advisory lock taken there excludes nothing on the primary, so it is
	// refused and fn does not run.
	ErrStandby = errors.New("txlock: server is a hot standby; a lock there would exclude nothing on the primary")

	// ErrTxDone: fn committed or rolled back the lock's transaction itself.
	// The lock ended with that transaction. WithLock does not commit again.
	ErrTxDone = errors.New("txlock: fn ended the lock's transaction itself (Commit or Rollback); the lock ended with it")

	// ErrHoldTimeout: the lock was held past the WithMaxHold bound, and its
	// transaction was rolled back.
	ErrHoldTimeout = errors.New("txlock: lock held past its WithMaxHold bound; transaction rolled back")

	// ErrInvalidArgument: a nil db, tx or fn, an empty key list, or an
	// invalid Option. Nothing was sent to the database.
	ErrInvalidArgument = errors.New("txlock: invalid argument")
)

// LockTimeoutError reports a lock that was not granted in time. It matches
// ErrLockTimeout, and, when the caller's context ended, that context's error
// (context.Canceled or context.DeadlineExceeded) too.
type LockTimeoutError struct {
	Keys     []Key         // the keys asked for, in canonical order
	Attempts int           // lock statements run
	Waited   time.Duration // time from the call to giving up
	Err      error         // the caller's context error, or nil if the timeout option ran out
}

func (e *LockTimeoutError) Error() string {
	var sb strings.Builder
	sb.WriteString("txlock: lock wait timed out: ")
	writeKeys(&sb, e.Keys)
	fmt.Fprintf(&sb, " not granted after %d attempts in %v", e.Attempts, e.Waited.Round(time.Microsecond))
	if e.Err != nil {
		sb.WriteString(": ")
		sb.WriteString(e.Err.Error())
	}
	return sb.String()
}

// Is reports whether target is ErrLockTimeout.
func (e *LockTimeoutError) Is(target error) bool { return target == ErrLockTimeout }

// Unwrap returns the caller's context error, if any.
func (e *LockTimeoutError) Unwrap() error { return e.Err }

// Lease describes, inside fn, the lock fn runs under. Get it with
// LeaseFromContext.
type Lease struct {
	Keys     []Key         // the locked keys, in canonical order
	Shared   bool          // shared (WithShared) rather than exclusive
	Held     bool          // false only when WithFailOpen ran fn without the lock
	Attempts int           // lock statements run before the grant
	Waited   time.Duration // time from the call to the grant
}

// lockState is what fn's context carries: the Lease, and what fencing
// tokens need.
type lockState struct {
	lease Lease
	db    Beginner // where the lock was taken: tokens are drawn there
	tx    *sql.Tx  // the lock's transaction

	mu     sync.Mutex
	tokens map[string]int64 // drawn fencing tokens, by sequence
}

type lockStateKey struct{}

func stateFrom(ctx context.Context) (*lockState, bool) {
	st, ok := ctx.Value(lockStateKey{}).(*lockState)
	return st, ok
}

// LeaseFromContext returns the Lease of the WithLock call whose fn received
// ctx (or a context derived from it).
func LeaseFromContext(ctx context.Context) (Lease, bool) {
	st, ok := stateFrom(ctx)
	if !ok {
		return Lease{}, false
	}
	return st.lease, true
}

// Held reports whether ctx belongs to a fn that holds its lock. It is false
// outside fn, and inside fn when WithFailOpen ran it without the lock.
func Held(ctx context.Context) bool {
	st, ok := stateFrom(ctx)
	return ok && st.lease.Held
}

// WithLock takes the exclusive transaction-scoped advisory lock key, then runs
// fn in the same transaction, and commits.
//
// Each attempt begins a transaction on db and runs, in one round trip,
// pg_try_advisory_xact_lock together with pg_is_in_recovery(). If the lock is
// busy, the transaction is rolled back at once, which returns its connection
// to the pool (and, behind PgBouncer in transaction mode, its server
// connection), and WithLock sleeps as the retry strategy says before trying
// again. The wait ends at the earlier of the context's deadline and the
// WithTimeout option (DefaultTimeout): the error then matches ErrLockTimeout.
//
// Once the lock is granted, fn runs with the transaction:
//   - fn returns nil: the transaction commits, and a commit error is returned;
//   - fn returns an error: the transaction rolls back, and that error is
//     returned as is;
//   - fn panics: the transaction rolls back, and the panic continues.
//
// The lock is released by that commit or rollback, and no sooner, so every
// write fn makes in tx is visible to the next holder. fn must not commit or
// roll back tx itself (ErrTxDone). Writes fn makes elsewhere (another
// database, a queue) escape the lock: see FenceToken.
//
// A server in recovery is refused with ErrStandby. Invalid arguments are
// reported with ErrInvalidArgument or ErrInvalidKey before the database is
// touched.
func WithLock(ctx context.Context, db Beginner, key Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	_, err := run(ctx, db, []Key{key}, fn, false, opts)
	return err
}

// WithLocks is WithLock for several keys, taken all or nothing: every
// attempt asks for all of them, in canonical order, in one statement, and a
// partial grant is rolled back with the attempt. It never deadlocks.
func WithLocks(ctx context.Context, db Beginner, keys []Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	_, err := run(ctx, db, keys, fn, false, opts)
	return err
}

// TryWithLock makes one attempt at key. If the lock is busy it returns
// (false, nil) without running fn: the shape for singleton jobs that skip a
// run when another instance has it. Otherwise it runs fn as WithLock does and
// returns (true, the result). An error that is not about the lock, such as a
// failed connection, is returned with false.
func TryWithLock(ctx context.Context, db Beginner, key Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return run(ctx, db, []Key{key}, fn, true, opts)
}

// TryWithLocks is TryWithLock for several keys, all or nothing.
func TryWithLocks(ctx context.Context, db Beginner, keys []Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return run(ctx, db, keys, fn, true, opts)
}

// LockTx takes the transaction-scoped advisory lock key inside the caller's
// transaction tx, for repository methods that already run in one. The lock
// lasts until tx commits or rolls back. Options as for WithLock, except that
// WithTxOptions, WithFailOpen and WithSerializationRetries do not apply.
//
// LockTx polls with pg_try_advisory_xact_lock, sleeping between attempts as
// WithLock does, but it cannot release the connection between attempts: the
// caller's transaction keeps it. Prefer WithLock where the lock can be the
// first thing a transaction does.
//
// A context cancelled while a statement runs makes pgx close the connection,
// which ends tx. Taking several keys one by one in different orders in
// different transactions can livelock until the timeout; use WithLocks.
func LockTx(ctx context.Context, tx *sql.Tx, key Key, opts ...Option) error {
	_, err := lockTx(ctx, tx, key, false, opts)
	return err
}

// TryLockTx makes one attempt at key inside the caller's transaction tx and
// reports whether the lock was granted.
func TryLockTx(ctx context.Context, tx *sql.Tx, key Key, opts ...Option) (acquired bool, err error) {
	return lockTx(ctx, tx, key, true, opts)
}

func lockTx(ctx context.Context, tx *sql.Tx, key Key, try bool, opts []Option) (bool, error) {
	c, err := newConfig(opts, true)
	if err != nil {
		return false, err
	}
	if tx == nil {
		return false, fmt.Errorf("%w: tx is nil", ErrInvalidArgument)
	}
	keys, err := canonicalKeys([]Key{key})
	if err != nil {
		return false, err
	}
	stmt := lockStatement(keys, c.shared, c.maxHold)
	_, err = c.wait(ctx, keys, try, func(context.Context) (outcome, error) {
		return tryLock(ctx, tx, stmt)
	})
	if errors.Is(err, errBusy) {
		return false, nil
	}
	return err == nil, err
}

// run is the loop behind WithLock, WithLocks, TryWithLock and TryWithLocks.
func run(ctx context.Context, db Beginner, keys []Key, fn func(context.Context, *sql.Tx) error, try bool, opts []Option) (bool, error) {
	c, err := newConfig(opts, false)
	if err != nil {
		return false, err
	}
	if isNil(db) {
		return false, fmt.Errorf("%w: db is nil", ErrInvalidArgument)
	}
	if fn == nil {
		return false, fmt.Errorf("%w: fn is nil", ErrInvalidArgument)
	}
	keys, err = canonicalKeys(keys)
	if err != nil {
		return false, err
	}
	stmt := lockStatement(keys, c.shared, c.maxHold)
	for round := 0; ; round++ {
		var h *holder
		lease, err := c.wait(ctx, keys, try, func(waitCtx context.Context) (outcome, error) {
			var out outcome
			var err error
			h, out, err = c.attempt(ctx, waitCtx, db, stmt)
			return out, err
		})
		if err != nil {
			if errors.Is(err, errBusy) {
				return false, nil
			}
			var te *LockTimeoutError
			if c.failOpen && errors.As(err, &te) && te.Err == nil {
				c.logger.WarnContext(ctx, "txlock: lock not granted; running fn without it (fail-open)",
					"keys", keysString(keys), "attempts", te.Attempts, "waited", te.Waited)
				return false, c.runUnlocked(ctx, db, fn, lease)
			}
			return false, err
		}
		err = h.run(fn, &lockState{lease: *lease, db: db, tx: h.tx})
		if round < c.serialRetries && retryable(err) {
			if !sleep(ctx, c.retry.Backoff(round+1)) {
				return true, err
			}
			continue
		}
		return true, err
	}
}

// errBusy is the internal result of a try that found the lock held.
var errBusy = errors.New("txlock: busy")

type outcome int

const (
	busy outcome = iota
	granted
	standby
)

// wait runs attempt until it reports granted, honouring the retry strategy,
// the timeout and ctx. try makes it stop after one busy attempt with errBusy.
func (c *config) wait(ctx context.Context, keys []Key, try bool, attempt func(waitCtx context.Context) (outcome, error)) (*Lease, error) {
	start := time.Now()
	lease := &Lease{Keys: keys, Shared: c.shared, Held: true}
	timeout := func() error {
		lease.Waited = time.Since(start)
		return &LockTimeoutError{Keys: keys, Attempts: lease.Attempts, Waited: lease.Waited, Err: ctx.Err()}
	}
	if err := ctx.Err(); err != nil {
		if try {
			return lease, fmt.Errorf("txlock: %s not attempted: %w", keysString(keys), err)
		}
		return lease, timeout()
	}
	waitCtx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	for {
		out, err := attempt(waitCtx)
		if err != nil {
			if waitCtx.Err() != nil && !try {
				return lease, timeout()
			}
			return lease, err
		}
		lease.Attempts++
		switch out {
		case granted:
			lease.Waited = time.Since(start)
			return lease, nil
		case standby:
			return lease, fmt.Errorf("%w (lock %s)", ErrStandby, keysString(keys))
		}
		if try {
			return lease, errBusy
		}
		d := c.retry.Backoff(lease.Attempts)
		if d < 0 || !sleep(waitCtx, d) {
			return lease, timeout()
		}
	}
}

// holder is a granted lock: its transaction and the contexts bound to it.
type holder struct {
	tx      *sql.Tx
	txCtx   context.Context // the context the transaction was begun with
	fnCtx   context.Context // txCtx, with the hold bound if any
	release func()
}

// attempt begins a transaction and runs the lock statement in it. Until the
// lock is granted, the transaction is bound to waitCtx as well as ctx.
func (c *config) attempt(ctx, waitCtx context.Context, db Beginner, stmt string) (*holder, outcome, error) {
	txCtx, txCancel := context.WithCancelCause(ctx)
	stopWait := context.AfterFunc(waitCtx, func() { txCancel(context.Cause(waitCtx)) })
	abort := func(tx *sql.Tx) {
		stopWait()
		if tx != nil {
			_ = tx.Rollback()
		}
		txCancel(nil)
	}
	tx, err := db.BeginTx(txCtx, c.txOpts)
	if err != nil {
		abort(nil)
		return nil, busy, fmt.Errorf("txlock: begin: %w", err)
	}
	out, err := tryLock(txCtx, tx, stmt)
	if err != nil || out != granted {
		abort(tx)
		return nil, out, err
	}
	if !stopWait() {
		// The wait deadline fired as the lock was granted; the transaction
		// is being rolled back, and fn must not run.
		abort(tx)
		return nil, busy, context.Cause(waitCtx)
	}
	h := &holder{tx: tx, txCtx: txCtx, fnCtx: txCtx, release: func() { txCancel(nil) }}
	if c.maxHold > 0 {
		fnCtx, cancelHold := context.WithTimeoutCause(txCtx, c.maxHold, ErrHoldTimeout)
		stopTie := context.AfterFunc(fnCtx, func() { txCancel(context.Cause(fnCtx)) })
		h.fnCtx = fnCtx
		h.release = func() {
			stopTie()
			cancelHold()
			txCancel(nil)
		}
	}
	return h, granted, nil
}

// run runs fn in the holder's transaction and commits or rolls back.
func (h *holder) run(fn func(context.Context, *sql.Tx) error, st *lockState) error {
	defer h.release()
	done := false
	defer func() {
		if !done { // fn panicked: roll back, and let the panic continue.
			_ = h.tx.Rollback()
		}
	}()
	fnErr := fn(context.WithValue(h.fnCtx, lockStateKey{}, st), h.tx)
	done = true
	if fnErr != nil {
		if err := h.tx.Rollback(); errors.Is(err, sql.ErrTxDone) && h.txCtx.Err() == nil {
			return errors.Join(fnErr, ErrTxDone)
		}
		if cause := context.Cause(h.fnCtx); errors.Is(cause, ErrHoldTimeout) && !errors.Is(fnErr, ErrHoldTimeout) {
			return errors.Join(fnErr, cause)
		}
		return fnErr
	}
	if h.fnCtx.Err() != nil {
		_ = h.tx.Rollback()
		return h.ended()
	}
	if err := h.tx.Commit(); err != nil {
		if errors.Is(err, sql.ErrTxDone) {
			if h.txCtx.Err() != nil {
				return h.ended()
			}
			return ErrTxDone
		}
		return fmt.Errorf("txlock: commit: %w", err)
	}
	return nil
}

// ended explains a transaction that was rolled back because its context
// ended: the hold bound, or the caller's context.
func (h *holder) ended() error {
	cause := context.Cause(h.fnCtx)
	if errors.Is(cause, ErrHoldTimeout) {
		return cause
	}
	return fmt.Errorf("txlock: transaction rolled back: %w", cause)
}

// runUnlocked runs fn without the lock, for WithFailOpen.
func (c *config) runUnlocked(ctx context.Context, db Beginner, fn func(context.Context, *sql.Tx) error, lease *Lease) error {
	lease.Held = false
	txCtx, txCancel := context.WithCancelCause(ctx)
	tx, err := db.BeginTx(txCtx, c.txOpts)
	if err != nil {
		txCancel(nil)
		return fmt.Errorf("txlock: begin: %w", err)
	}
	h := &holder{tx: tx, txCtx: txCtx, fnCtx: txCtx, release: func() { txCancel(nil) }}
	return h.run(fn, &lockState{lease: *lease, db: db, tx: tx})
}

// tryLock runs the lock statement and decodes its outcome.
//
// The statement takes no parameters, so pgx sends it with the simple
// protocol whatever default_query_exec_mode the application chose: no
// prepared statement is created, which is what PgBouncer in transaction mode
// needs. Its answer is carried in the row count of the command tag (see
// lockStatement), which database/sql returns as RowsAffected.
func tryLock(ctx context.Context, tx *sql.Tx, stmt string) (outcome, error) {
	res, err := tx.ExecContext(ctx, stmt)
	if err != nil {
		return busy, fmt.Errorf("txlock: lock statement: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return busy, fmt.Errorf("txlock: lock statement result: %w", err)
	}
	switch n {
	case 0:
		return busy, nil
	case 1:
		return granted, nil
	case 2:
		return standby, nil
	}
	return busy, fmt.Errorf("txlock: lock statement reported %d rows, want 0, 1 or 2 (the driver must report RowsAffected for SELECT)", n)
}

// lockStatement builds the one statement of an attempt. It returns no rows
// if a lock is busy, one row if all are granted on a primary, and two rows if
// the server is in recovery (no lock is then attempted):
//
//	SELECT 1 FROM generate_series(1, CASE
//	  WHEN pg_is_in_recovery() THEN 2
//	  WHEN pg_try_advisory_xact_lock(k1) AND pg_try_advisory_xact_lock(k2) ... THEN 1
//	  ELSE 0 END)
//
// With a hold bound, the granted branch also sets
// idle_in_transaction_session_timeout with set_config(…, true), which lasts
// until the transaction ends.
func lockStatement(keys []Key, shared bool, maxHold time.Duration) string {
	fn := "pg_try_advisory_xact_lock("
	if shared {
		fn = "pg_try_advisory_xact_lock_shared("
	}
	var sb strings.Builder
	sb.WriteString("SELECT 1 FROM generate_series(1, CASE WHEN pg_is_in_recovery() THEN 2 WHEN ")
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(" AND ")
		}
		sb.WriteString(fn)
		sb.WriteString(k.sqlArgs())
		sb.WriteByte(')')
	}
	if maxHold > 0 {
		ms := (maxHold + time.Millisecond - 1) / time.Millisecond
		sb.WriteString(" AND set_config('idle_in_transaction_session_timeout', '")
		sb.WriteString(strconv.FormatInt(int64(ms), 10))
		sb.WriteString("', true) IS NOT NULL")
	}
	sb.WriteString(" THEN 1 ELSE 0 END)")
	return sb.String()
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
	return slices.CompactFunc(out, func(x, y Key) bool { return compareKeys(x, y) == 0 }), nil
}

// retryable reports a serialization failure or a deadlock.
func retryable(err error) bool {
	switch SQLState(err) {
	case "40001", "40P01":
		return true
	}
	return false
}

// SQLState returns the SQLSTATE code of the first PostgreSQL error in err's
// chain, or "" if there is none. It works with any driver whose errors have
// a SQLState() string method, as pgx's *pgconn.PgError does.
func SQLState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Func, reflect.Slice, reflect.Chan:
		return rv.IsNil()
	}
	return false
}

func keysString(keys []Key) string {
	var sb strings.Builder
	writeKeys(&sb, keys)
	return sb.String()
}

func writeKeys(sb *strings.Builder, keys []Key) {
	for i, k := range keys {
		if i > 0 {
			sb.WriteString(", ")
		}
		sb.WriteString(k.String())
	}
}
