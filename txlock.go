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
	"sync/atomic"
	"time"
)

// Beginner is what WithLock needs of a database: *sql.DB, *sql.Conn and
// *sqlx.DB all satisfy it. A *sql.Conn is one session, with room for one
// transaction: it must not be shared by WithLock calls that run at the same
// time (database/sql lets a second transaction begin on it, inside the
// first, where it would be granted the first one's locks).
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

	// ErrCommitFailed: fn succeeded, but committing its transaction failed.
	// A server error (a deferred constraint, a serialization failure) means
	// nothing was committed; a broken connection or an ended context during
	// COMMIT leaves the outcome unknown. The cause stays reachable with
	// errors.Is and errors.As.
	ErrCommitFailed = errors.New("txlock: commit failed")

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
// tokens need. It is fn's context itself, wrapping the context fn runs
// under, so that handing it to fn costs no allocation.
type lockState struct {
	context.Context
	lease Lease
	db    Beginner // where the lock was taken: tokens are drawn there
	tx    *sql.Tx  // the lock's transaction

	ended atomic.Bool // fn has returned: the lock is gone, or going

	mu     sync.Mutex
	tokens map[string]int64 // drawn fencing tokens, by sequence
}

type lockStateKey struct{}

// String implements fmt.Stringer, so that printing fn's context neither
// walks the state's fields nor races with FenceToken.
func (st *lockState) String() string { return "txlock.fnContext" }

// Value implements context.Context: the lockState answers for its own key.
func (st *lockState) Value(key any) any {
	if key == (lockStateKey{}) {
		return st
	}
	return st.Context.Value(key)
}

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
// outside fn, inside fn when WithFailOpen ran it without the lock, once the
// context has ended (the transaction, and with it the lock, is then being
// rolled back), and after fn has returned. It is advisory: a lock can also
// be lost to a dead session without the client knowing; guard writes that
// leave the transaction with fencing tokens.
func Held(ctx context.Context) bool {
	st, ok := stateFrom(ctx)
	return ok && st.lease.Held && !st.ended.Load() && ctx.Err() == nil
}

// WithLock takes the exclusive transaction-scoped advisory lock key, then runs
// fn in the same transaction, and commits.
//
// Each attempt begins a transaction on db and runs, in one round trip,
// pg_try_advisory_xact_lock together with pg_is_in_recovery(). If the lock is
// busy, the transaction is rolled back at once, which returns its connection
// to the pool (and, behind PgBouncer in transaction mode, its server
// connection), and WithLock sleeps as the retry strategy says before trying
// again. Callers in this process that wait for the same keys on the same
// db queue behind each other locally, in FIFO order: only the first polls,
// and when it is done the next tries at once, so the lock passes between
// goroutines of one process with no sleep in between and the database sees
// one poller per key per process. Waiting in that queue holds no connection
// either, except at a handoff on a *sql.DB: once the holder's fn returns,
// the next caller begins its transaction (if the pool has an idle
// connection) while the holder's COMMIT or ROLLBACK runs, holds it for at
// most 50 ms of that (then it rolls back and waits without it), and sends
// its lock statement once the COMMIT has returned. With
// WithRetry(ServerWait{…}) the head of that queue waits for the lock in the
// server's queue, for a bounded window per attempt, instead of polling (see
// ServerWait). The wait ends at the earlier of the context's deadline and
// the WithTimeout option (DefaultTimeout): the error then matches
// ErrLockTimeout.
//
// Once the lock is granted, fn runs with the transaction:
//   - fn returns nil: the transaction commits, and a commit error is returned;
//   - fn returns an error: the transaction rolls back, and that error is
//     returned (joined with ErrTxDone or ErrHoldTimeout if fn also ended the
//     transaction itself or outlived WithMaxHold; errors.Is and errors.As
//     still find it);
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
	_, err := run(ctx, db, nil, key, fn, false, opts)
	return err
}

// WithLocks is WithLock for several keys, taken all or nothing: every
// attempt asks for all of them, in canonical order, in one statement, and a
// partial grant is rolled back with the attempt. It never deadlocks.
func WithLocks(ctx context.Context, db Beginner, keys []Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	if keys == nil {
		keys = []Key{}
	}
	_, err := run(ctx, db, keys, Key{}, fn, false, opts)
	return err
}

// TryWithLock makes one attempt at key. If the lock is busy it returns
// (false, nil) without running fn: the shape for singleton jobs that skip a
// run when another instance has it. Otherwise it runs fn as WithLock does and
// returns (true, the result). An error that is not about the lock, such as a
// failed connection, is returned with false.
func TryWithLock(ctx context.Context, db Beginner, key Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return run(ctx, db, nil, key, fn, true, opts)
}

// TryWithLocks is TryWithLock for several keys, all or nothing.
func TryWithLocks(ctx context.Context, db Beginner, keys []Key, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	if keys == nil {
		keys = []Key{}
	}
	return run(ctx, db, keys, Key{}, fn, true, opts)
}

// LockTx takes the transaction-scoped advisory lock key inside the caller's
// transaction tx, for repository methods that already run in one. The lock
// lasts until tx commits or rolls back. Options as for WithLock, except that
// WithTxOptions, WithFailOpen and WithSerializationRetries, which concern
// a transaction of txlock's own, are refused (ErrInvalidArgument).
//
// LockTx polls with pg_try_advisory_xact_lock, sleeping between attempts as
// WithLock does, but it cannot release the connection between attempts: the
// caller's transaction keeps it. Prefer WithLock where the lock can be the
// first thing a transaction does.
//
// With WithRetry(ServerWait{…}), LockTx waits in the server's lock queue
// instead, one window at a time, inside a SAVEPOINT: a window that passes
// (lock_timeout, 55P03) is rolled back to the savepoint, leaving the caller's
// transaction and its lock_timeout as they were, and a granted lock lasts
// until the transaction ends. Two transactions that take keys in
// conflicting orders then deadlock in the server, and PostgreSQL's deadlock
// detector ends one wait after deadlock_timeout: LockTx returns that error,
// whose SQLState is 40P01, at once, with the caller's transaction still
// usable (roll it back, and retry the whole transaction if you like).
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
	a := &txAttempt{tx: tx}
	c := &a.c
	if err := c.init(opts, true); err != nil {
		return false, err
	}
	if tx == nil {
		return false, fmt.Errorf("%w: tx is nil", ErrInvalidArgument)
	}
	if err := key.Err(); err != nil {
		return false, err
	}
	a.lease = Lease{Keys: a.one[:], Shared: c.shared, Held: true}
	a.one[0] = key
	a.stmt = lockStatement(a.lease.Keys, c.shared, c.maxHold, false)
	err := c.wait(ctx, &a.lease, try, a)
	if errors.Is(err, errBusy) {
		return false, nil
	}
	return err == nil, err
}

// txAttempt is an attempt of LockTx: a statement in the caller's
// transaction.
type txAttempt struct {
	c     config
	tx    *sql.Tx
	stmt  string
	lease Lease
	one   [1]Key
}

// savepoint isolates a server-side wait inside the caller's transaction: a
// lock_timeout (55P03) or deadlock (40P01) error aborts only what follows it.
const savepoint = "txlock_wait"

// attempt runs the lock statement in the caller's transaction. Statements
// run under ctx, not waitCtx: cancelling a statement closes the connection,
// which would end the caller's transaction. A server-side wait is bounded by
// lock_timeout instead, and runs in a savepoint, so that its timeout leaves
// the caller's transaction usable: ROLLBACK TO SAVEPOINT undoes the failed
// wait (and its set_config), RELEASE SAVEPOINT keeps a granted lock until the
// transaction ends.
func (a *txAttempt) attempt(ctx, _ context.Context, _ time.Time, window time.Duration) (outcome, error) {
	if window <= 0 {
		return tryLock(ctx, a.tx, a.stmt)
	}
	out, err := tryLock(ctx, a.tx, "SAVEPOINT "+savepoint+"; "+waitStatement(a.lease.Keys, a.c.shared, a.c.maxHold, window))
	if err != nil {
		if code := SQLState(err); code == "55P03" || code == "40P01" || isIsolationError(err) {
			if _, rerr := a.tx.ExecContext(ctx, "ROLLBACK TO SAVEPOINT "+savepoint+"; RELEASE SAVEPOINT "+savepoint); rerr != nil {
				return busy, errors.Join(err, fmt.Errorf("txlock: rollback to savepoint: %w", rerr))
			}
			if code == "40P01" {
				// A deadlock between caller transactions: waiting again would
				// deadlock again. The caller's transaction is still usable.
				return busy, fmt.Errorf("txlock: lock %s: %w", keysString(a.lease.Keys), err)
			}
			if code == "55P03" {
				return busy, nil
			}
			// The isolation level was refused (see waitStatement). The
			// caller's transaction is still usable.
			return busy, err
		}
		return busy, err
	}
	if _, err := a.tx.ExecContext(ctx, "RELEASE SAVEPOINT "+savepoint); err != nil {
		return busy, fmt.Errorf("txlock: release savepoint: %w", err)
	}
	return out, nil
}

// runner is the state of one WithLock call, in one allocation: its lease,
// and its transaction once the lock is granted.
type runner struct {
	c    config
	db   Beginner
	stmt string
	// gateID names the local queue of this call's keys (zero if it does
	// not queue: shared locks, try, a db handle that is not a pointer);
	// gate is held while the call has the turn.
	gateID gateKey
	gate   *gate
	// prevEnd, if not nil, ends with the transaction of the caller that
	// handed this call its turn before that transaction ended: the next
	// lock statement waits for it (see handOn).
	prevEnd chan struct{}
	// end, if not nil, is closed once this call's transaction has ended:
	// it handed its turn on before then (see handOn).
	end chan struct{}
	st  *lockState // the lease, and what fn's context carries
	st0 lockState  // st of the first round
	one [1]Key
	h   holder
}

// enqueue implements queuer.
func (r *runner) enqueue(waitCtx context.Context) (queued, turn bool) {
	if r.gateID.db == nil || r.gate != nil {
		return false, false
	}
	g, prevEnd, ok := enterGate(waitCtx, r.gateID)
	r.gate, r.prevEnd = g, prevEnd
	return true, ok
}

// queueFirst implements queuer. With ServerWait every call queues before
// its first attempt, as that attempt may wait in the server: the queue's
// head is then this process's only waiter in the server's queue.
func (r *runner) queueFirst() bool {
	if r.gateID.db == nil {
		return false
	}
	if r.c.window > 0 {
		return true
	}
	gates.Lock()
	defer gates.Unlock()
	return gates.m[r.gateID] != nil
}

// leaveGate gives up the call's turn in its local queue, if it has one.
// An end of a previous transaction that the call did not wait for passes
// on with the turn. It is called once the call's transaction has ended.
func (r *runner) leaveGate() {
	if r.end != nil {
		close(r.end)
		r.end = nil
	}
	if r.gate != nil {
		leaveGate(r.gateID, r.gate, true, r.prevEnd)
		r.gate, r.prevEnd = nil, nil
	}
}

// handOn passes a polling call's turn on once fn has returned, before its
// transaction ends, if another caller is queued. The next caller begins its
// transaction while this one's COMMIT or ROLLBACK is in flight, and sends
// its lock statement once that has returned (r.end, closed by leaveGate):
// the lock passes with the round trip of one statement instead of two, and
// that waiter holds its connection only while the COMMIT runs, for at most
// maxEarlyBegin (see runner.begin).
func (r *runner) handOn() {
	gates.Lock()
	queued := r.gate.refs > 1
	gates.Unlock()
	if !queued {
		return // nobody to hand on to: keep the turn until the end
	}
	// r.prevEnd is nil: the lock statement that granted this call's lock
	// waited for it.
	r.end = make(chan struct{})
	leaveGate(r.gateID, r.gate, true, r.end)
	r.gate = nil
}

// maxEarlyBegin bounds how long a caller that was handed its turn early
// (see handOn) holds its begun transaction, and so a connection, while the
// previous holder's COMMIT runs.
const maxEarlyBegin = 50 * time.Millisecond

// begin begins an attempt's transaction. After an early handoff it then
// waits for the previous holder's COMMIT or ROLLBACK to return, so that the
// lock statement finds the lock free and takes its snapshot after that
// COMMIT. If it takes longer than maxEarlyBegin, the transaction is rolled
// back, and begun again once it has returned. When the pool has no idle
// connection, the early BEGIN would have to open one, or wait for the
// holder's: begin then waits first.
func (r *runner) begin(ctx context.Context) (*sql.Tx, error) {
	if r.prevEnd != nil {
		if pool, ok := r.gateID.db.(*sql.DB); !ok || pool.Stats().Idle == 0 {
			if err := r.awaitPrev(ctx); err != nil {
				return nil, err
			}
		}
	}
	tx, err := r.db.BeginTx(ctx, r.c.txOpts)
	if err != nil || r.prevEnd == nil {
		return tx, err
	}
	t := time.NewTimer(maxEarlyBegin)
	defer t.Stop()
	select {
	case <-r.prevEnd:
		r.prevEnd = nil
		return tx, nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = tx.Rollback()
	if err := r.awaitPrev(ctx); err != nil {
		return nil, err
	}
	return r.db.BeginTx(ctx, r.c.txOpts)
}

// awaitPrev waits, without a transaction, for the end of the transaction
// that handed this call its turn early, or for ctx.
func (r *runner) awaitPrev(ctx context.Context) error {
	select {
	case <-r.prevEnd:
		r.prevEnd = nil
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// run is the loop behind WithLock, WithLocks, TryWithLock and TryWithLocks.
// keys is nil for the single key one.
func run(ctx context.Context, db Beginner, keys []Key, one Key, fn func(context.Context, *sql.Tx) error, try bool, opts []Option) (bool, error) {
	r := &runner{db: db}
	c := &r.c
	if err := c.init(opts, false); err != nil {
		return false, err
	}
	if isNil(db) {
		return false, fmt.Errorf("%w: db is nil", ErrInvalidArgument)
	}
	if fn == nil {
		return false, fmt.Errorf("%w: fn is nil", ErrInvalidArgument)
	}
	if keys == nil {
		if err := one.Err(); err != nil {
			return false, err
		}
		r.one[0] = one
		keys = r.one[:]
	} else {
		var err error
		if keys, err = canonicalKeys(keys); err != nil {
			return false, err
		}
	}
	r.stmt = lockStatement(keys, c.shared, c.maxHold, true)
	if !try && !c.shared {
		r.gateID = gateKey{db: queueHandle(db), stmt: r.stmt, serverWait: c.window > 0}
	}
	defer r.leaveGate()
	for round := 0; ; round++ {
		// Each round has its own state: a context that fn kept from an
		// earlier round keeps describing that round's lock.
		if round == 0 {
			r.st = &r.st0
		} else {
			r.st = &lockState{}
		}
		r.st.lease = Lease{Keys: keys, Shared: c.shared, Held: true}
		err := c.wait(ctx, &r.st.lease, try, r)
		if err != nil {
			r.leaveGate()
			if errors.Is(err, errBusy) {
				return false, nil
			}
			var te *LockTimeoutError
			if c.failOpen && errors.As(err, &te) && te.Err == nil {
				c.logger.WarnContext(ctx, "txlock: lock not granted; running fn without it (fail-open)",
					"keys", keysString(keys), "attempts", te.Attempts, "waited", te.Waited)
				return false, c.runUnlocked(ctx, db, fn, &r.st.lease)
			}
			return false, err
		}
		r.st.db, r.st.tx = db, r.h.tx
		var handoff func()
		if _, pool := r.gateID.db.(*sql.DB); pool && r.gate != nil {
			// The next caller of this process may start as soon as fn is
			// done. Not on a single connection, which has room for one
			// transaction only.
			if c.window > 0 {
				// Its wait in the server is granted the moment this
				// transaction ends, with no round trip in between.
				handoff = r.leaveGate
			} else {
				handoff = r.handOn
			}
		}
		err = r.h.run(fn, r.st, handoff)
		r.leaveGate()
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

// attempter makes one lock attempt. waitCtx is nil during the first attempt
// of a call, and afterwards ends when the wait's deadline passes; an attempt
// must not outlast deadline. window is how long the attempt may wait inside
// the server (0: not at all).
type attempter interface {
	attempt(ctx, waitCtx context.Context, deadline time.Time, window time.Duration) (outcome, error)
}

// wait runs a's attempts until one reports granted, honouring the retry
// strategy, the timeout and ctx, and records them in lease. try makes it
// stop after one busy attempt with errBusy.
//
// Every attempt, and every sleep between attempts, ends by the deadline.
// The first attempt is bound to it without a derived context (see
// runner.attempt), so that an uncontended lock costs little beyond its one
// statement.
func (c *config) wait(ctx context.Context, lease *Lease, try bool, a attempter) error {
	start := time.Now()
	timeout := func() error {
		lease.Waited = time.Since(start)
		return &LockTimeoutError{Keys: lease.Keys, Attempts: lease.Attempts, Waited: lease.Waited, Err: ctx.Err()}
	}
	if err := ctx.Err(); err != nil {
		if try {
			return fmt.Errorf("txlock: %s not attempted: %w", keysString(lease.Keys), err)
		}
		return timeout()
	}
	deadline := start.Add(c.timeout)
	var waitCtx context.Context
	if q, ok := a.(queuer); ok && !try && q.queueFirst() {
		var cancel context.CancelFunc
		waitCtx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
		if _, turn := q.enqueue(waitCtx); !turn {
			return timeout()
		}
	}
	window := c.window
	if try {
		window = 0
	}
	for {
		w := window
		if w > 0 {
			// Never wait in the server past the deadline.
			w = min(w, time.Until(deadline))
			if w < time.Millisecond {
				w = time.Millisecond
			}
		}
		out, err := a.attempt(ctx, waitCtx, deadline, w)
		if err != nil {
			// Only the wait's own end is a timeout: a connection error
			// that happens to arrive after the deadline stays what it is
			// (and never triggers WithFailOpen).
			if !try && (ctx.Err() != nil || !time.Now().Before(deadline) && isContextErr(err)) {
				return timeout()
			}
			return err
		}
		lease.Attempts++
		switch out {
		case granted:
			lease.Waited = time.Since(start)
			return nil
		case standby:
			return fmt.Errorf("%w (lock %s)", ErrStandby, keysString(lease.Keys))
		}
		if try {
			return errBusy
		}
		d := c.retry.Backoff(lease.Attempts)
		if d < 0 {
			return timeout()
		}
		if waitCtx == nil {
			var cancel context.CancelFunc
			waitCtx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
			if q, ok := a.(queuer); ok {
				if queued, turn := q.enqueue(waitCtx); queued {
					if !turn {
						return timeout()
					}
					continue // our turn: the local holder, if any, just let go
				}
			}
		}
		if !sleep(waitCtx, d) {
			return timeout()
		}
	}
}

// isContextErr reports an error caused by a context ending: how an attempt
// cut off by the wait's deadline fails.
func isContextErr(err error) bool {
	return errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)
}

// queuer is an attempter that can queue, in this process, behind the other
// callers that wait for the same keys: enqueue reports whether it queued,
// and whether it then got its turn before waitCtx ended.
type queuer interface {
	enqueue(waitCtx context.Context) (queued, turn bool)
	// queueFirst reports that others are already queued for the same keys:
	// the call then joins the queue before its first attempt instead of
	// overtaking them.
	queueFirst() bool
}

// gates are the local queues of WithLock calls that wait for the same keys
// in this process: only the caller at the head of a queue polls the
// database (or, with ServerWait, waits in the server's queue), and it keeps
// its turn while it holds the lock, until its fn returns (on a *sql.DB) or
// its transaction ends. Then the next caller goes at once, so the lock
// passes between goroutines of one process without a sleep, in FIFO order,
// and the database sees one waiter per key per process instead of one per
// goroutine. Waiting in a gate holds no connection. Polling and ServerWait
// calls queue apart, as their handoffs differ: a ServerWait caller starts
// its wait in the server at once, a polling one begins its transaction and
// sends its lock statement once the previous holder's COMMIT or ROLLBACK
// has returned (see runner.handOn).
var gates struct {
	sync.Mutex
	m map[gateKey]*gate
}

// gateKey names a local queue: the same keys (the same lock statement) on
// the same database handle.
type gateKey struct {
	db         any // see queueHandle
	stmt       string
	serverWait bool
}

// queueHandle is the identity of db for the local queues, or nil if its
// calls do not queue. A Beginner that wraps another handle for one call (as
// package sqlxlock does) names the handle it wraps with a TxlockQueueHandle
// method, so that its calls share a queue with every other call on that
// handle. A pointer to a struct that embeds a *sql.DB (as *sqlx.DB does)
// is that *sql.DB. Only pointers qualify: any other value could hold
// something that panics when compared.
func queueHandle(db Beginner) any {
	var h any = db
	if w, ok := db.(interface{ TxlockQueueHandle() any }); ok {
		h = w.TxlockQueueHandle()
	}
	if h == nil {
		return nil
	}
	v := reflect.ValueOf(h)
	if v.Kind() != reflect.Pointer {
		return nil
	}
	if _, ok := h.(*sql.DB); !ok && !v.IsNil() && v.Elem().Kind() == reflect.Struct {
		if f, ok := v.Elem().Type().FieldByName("DB"); ok && f.Anonymous && f.Type == sqlDBType {
			if inner := v.Elem().FieldByIndex(f.Index); !inner.IsNil() {
				return inner.Interface()
			}
		}
	}
	return h
}

var sqlDBType = reflect.TypeOf((*sql.DB)(nil))

// gate is one local queue: ch holds the turn while no caller has it. The
// turn carries the end of the previous holder's transaction if it was
// handed on before that ended (see runner.handOn), and nil otherwise.
type gate struct {
	ch   chan chan struct{}
	refs int // callers queued or holding the turn
}

// enterGate waits for the turn at gate id, until waitCtx ends. prevEnd is
// what the turn carries.
func enterGate(waitCtx context.Context, id gateKey) (g *gate, prevEnd chan struct{}, ok bool) {
	gates.Lock()
	if gates.m == nil {
		gates.m = map[gateKey]*gate{}
	}
	g = gates.m[id]
	if g == nil {
		g = &gate{ch: make(chan chan struct{}, 1)}
		g.ch <- nil
		gates.m[id] = g
	}
	g.refs++
	gates.Unlock()
	select {
	case prevEnd = <-g.ch:
		return g, prevEnd, true
	case <-waitCtx.Done():
		leaveGate(id, g, false, nil)
		return nil, nil, false
	}
}

// leaveGate leaves gate id, passing the turn on, with prevEnd, if the
// caller had it.
func leaveGate(id gateKey, g *gate, hadTurn bool, prevEnd chan struct{}) {
	if hadTurn {
		g.ch <- prevEnd
	}
	gates.Lock()
	if g.refs--; g.refs == 0 {
		delete(gates.m, id)
	}
	gates.Unlock()
}

// holder is a granted lock: its transaction and the contexts bound to it.
type holder struct {
	tx       *sql.Tx
	txCtx    context.Context // the context the transaction was begun with
	fnCtx    context.Context // txCtx, with the hold bound if any
	cancel   context.CancelCauseFunc
	stopTie  func() bool        // unties the hold bound from txCtx
	stopHold context.CancelFunc // releases the hold bound's context
}

// release frees what the holder's contexts hold, once fn is done.
func (h *holder) release() {
	if h.stopTie != nil {
		h.stopTie()
		h.stopHold()
	}
	if h.cancel != nil {
		h.cancel(nil)
	}
}

// attempt begins a transaction and runs the lock statement in it. Until the
// lock is granted, the transaction is bound to the wait's deadline as well
// as to ctx, so that a stalled BEGIN or statement ends with the wait.
//
// On the first attempt (waitCtx nil) that bound is a timer, or nothing at
// all when ctx's own deadline comes first: an uncontended call of a request
// handler, whose context has a deadline, then begins the transaction with
// ctx itself, and fn runs under the caller's context. Later attempts are
// bound to waitCtx.
func (r *runner) attempt(ctx, waitCtx context.Context, deadline time.Time, window time.Duration) (outcome, error) {
	c := &r.c
	stmt := r.stmt
	if window > 0 {
		stmt = waitStatement(r.st.lease.Keys, c.shared, c.maxHold, window)
	}
	if waitCtx == nil && c.maxHold == 0 {
		if d, ok := ctx.Deadline(); ok && !d.After(deadline) {
			tx, err := r.db.BeginTx(ctx, c.txOpts)
			if err != nil {
				return busy, fmt.Errorf("txlock: begin: %w", err)
			}
			out, err := attemptIn(ctx, tx, stmt)
			if err == nil && out == granted && ctx.Err() != nil {
				// ctx ended as the lock was granted: database/sql is
				// rolling the transaction back, and fn must not start.
				out, err = busy, ctx.Err()
			}
			if err != nil || out != granted {
				_ = tx.Rollback()
				return out, err
			}
			r.h = holder{tx: tx, txCtx: ctx, fnCtx: ctx}
			return granted, nil
		}
	}
	txCtx, txCancel := context.WithCancelCause(ctx)
	var stopAfter func() bool
	var timer *time.Timer
	if waitCtx != nil {
		stopAfter = context.AfterFunc(waitCtx, func() { txCancel(context.Cause(waitCtx)) })
	} else {
		timer = time.AfterFunc(time.Until(deadline), func() { txCancel(context.DeadlineExceeded) })
	}
	tx, err := r.begin(txCtx)
	if err != nil {
		unbind(timer, stopAfter)
		txCancel(nil)
		return busy, fmt.Errorf("txlock: begin: %w", err)
	}
	out, err := attemptIn(txCtx, tx, stmt)
	if err == nil && out == granted && (!unbind(timer, stopAfter) || txCtx.Err() != nil) {
		// The deadline fired, or ctx ended, as the lock was granted; the
		// transaction is being rolled back, and fn must not start.
		out, err = busy, context.DeadlineExceeded
	}
	if err != nil || out != granted {
		unbind(timer, stopAfter)
		_ = tx.Rollback()
		txCancel(nil)
		return out, err
	}
	// Once the deadline is unbound, txCtx ends only with ctx (or when fn is
	// done), so fn can run under ctx itself: when ctx cannot be cancelled,
	// the driver then has no context to watch around each of fn's
	// statements.
	r.h = holder{tx: tx, txCtx: txCtx, fnCtx: ctx, cancel: txCancel}
	if c.maxHold > 0 {
		fnCtx, cancelHold := context.WithTimeoutCause(txCtx, c.maxHold, ErrHoldTimeout)
		r.h.fnCtx = fnCtx
		r.h.stopHold = cancelHold
		r.h.stopTie = context.AfterFunc(fnCtx, func() { txCancel(context.Cause(fnCtx)) })
	}
	return granted, nil
}

// unbind stops the wait's deadline (a timer, or an AfterFunc on the wait's
// context) from ending an attempt's transaction, and reports whether it had
// not already.
func unbind(timer *time.Timer, stopAfter func() bool) bool {
	if timer != nil {
		return timer.Stop()
	}
	return stopAfter()
}

// attemptIn runs the lock statement of an attempt in its own transaction.
// A server-side wait that ends in lock_timeout (55P03), or that the deadlock
// detector picks (40P01), is a busy lock: the caller rolls the transaction
// back, which undoes whatever the statement did.
func attemptIn(ctx context.Context, tx *sql.Tx, stmt string) (outcome, error) {
	out, err := tryLock(ctx, tx, stmt)
	if err != nil {
		switch SQLState(err) {
		case "55P03", "40P01":
			return busy, nil
		}
	}
	return out, err
}

// run runs fn in the holder's transaction and commits or rolls back.
//
// handoff, if not nil, runs once fn has returned, before the commit or
// rollback.
func (h *holder) run(fn func(context.Context, *sql.Tx) error, st *lockState, handoff func()) error {
	defer h.release()
	defer st.ended.Store(true)
	done := false
	defer func() {
		if !done { // fn panicked: roll back, and let the panic continue.
			_ = h.tx.Rollback()
		}
	}()
	st.Context = h.fnCtx
	fnErr := fn(st, h.tx)
	done = true
	if handoff != nil {
		handoff()
	}
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
		if h.txCtx.Err() != nil && !errors.Is(err, sql.ErrTxDone) {
			// The context ended as Commit ran: database/sql refused to
			// commit, or the driver cut the COMMIT off mid-flight.
			return fmt.Errorf("%w: interrupted as the transaction's context ended, so it may or may not have taken effect: %w: %w", ErrCommitFailed, context.Cause(h.fnCtx), err)
		}
		if errors.Is(err, sql.ErrTxDone) {
			if h.txCtx.Err() != nil {
				return h.ended()
			}
			return ErrTxDone
		}
		return fmt.Errorf("%w: %w", ErrCommitFailed, err)
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
	h := &holder{tx: tx, txCtx: txCtx, fnCtx: txCtx, cancel: txCancel}
	return h.run(fn, &lockState{lease: *lease, db: db, tx: tx}, nil)
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
		if isStandbyError(err) {
			return standby, nil
		}
		if isIsolationError(err) {
			return busy, errServerWaitIsolation(err)
		}
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
// With ownTx (the attempt's transaction is txlock's own, which a failed
// attempt rolls back), the statement is the cheaper
//
//	SELECT 1 WHERE CASE
//	  WHEN pg_is_in_recovery() THEN set_config('txlock.in_recovery', '<standbyMarker>', true)::int = 0
//	  WHEN pg_try_advisory_xact_lock(k1) AND pg_try_advisory_xact_lock(k2) ... THEN true
//	  ELSE false END
//
// which returns no row or one, and fails on a server in recovery with an
// error (22P02) that carries standbyMarker: the set-returning function costs
// the server about as much again as the lock itself, and an error would
// abort a caller's transaction, so LockTx keeps the first form. Both
// evaluate pg_is_in_recovery() once, before any lock: a promotion during
// the statement cannot make a standby's answer read as a grant.
//
// With a hold bound, a branch before the locks sets
// idle_in_transaction_session_timeout with set_config(…, true), which lasts
// until the transaction ends. It comes first so that it covers every
// attempt: a partial grant of several keys, too, holds a lock until the
// attempt's rollback arrives, and a client frozen or cut off before sending
// it must not keep that lock past the bound.
func lockStatement(keys []Key, shared bool, maxHold time.Duration, ownTx bool) string {
	fn := "pg_try_advisory_xact_lock("
	if shared {
		fn = "pg_try_advisory_xact_lock_shared("
	}
	no, yes := " THEN 0", " THEN 1 ELSE 0 END)"
	var buf [320]byte // one key's statement fits: building it costs only the string
	b := buf[:0]
	if ownTx {
		no, yes = " THEN false", " THEN true ELSE false END"
		b = append(b, "SELECT 1 WHERE CASE WHEN pg_is_in_recovery() THEN set_config('txlock.in_recovery', '"+standbyMarker+"', true)::int = 0"...)
	} else {
		b = append(b, "SELECT 1 FROM generate_series(1, CASE WHEN pg_is_in_recovery() THEN 2"...)
	}
	b = appendHoldBound(b, maxHold, no)
	b = append(b, " WHEN "...)
	for i, k := range keys {
		if i > 0 {
			b = append(b, " AND "...)
		}
		b = append(b, fn...)
		b = appendSQLArgs(b, k)
		b = append(b, ')')
	}
	b = append(b, yes...)
	return string(b)
}

// standbyMarker is the text of the error by which the statement of
// lockStatement(…, ownTx = true) reports a server in recovery.
const standbyMarker = "txlock: the server is in recovery, no lock was attempted"

// isStandbyError reports the error of lockStatement(…, ownTx = true) on a
// server in recovery.
func isStandbyError(err error) bool {
	return SQLState(err) == "22P02" && strings.Contains(err.Error(), standbyMarker)
}

// isolationMarker begins the text of the error by which waitStatement
// refuses a transaction above ReadCommitted; the level follows it.
const isolationMarker = "txlock: ServerWait refused, the transaction is "

// isIsolationError reports waitStatement's refusal of the transaction's
// isolation level.
func isIsolationError(err error) bool {
	return SQLState(err) == "22P02" && strings.Contains(err.Error(), isolationMarker)
}

// errServerWaitIsolation explains isIsolationError's err.
func errServerWaitIsolation(err error) error {
	return fmt.Errorf("%w: ServerWait needs ReadCommitted: the snapshot of a transaction above it would be taken before the wait, so fn would not see the previous holder's writes (the level may come from the server's default_transaction_isolation): %w", ErrInvalidArgument, err)
}

// waitStatement builds the statement of an attempt that waits for the lock
// in the server's queue (ServerWait) for at most window. Its rows mean what
// lockStatement's mean, and it too takes no parameters:
//
//	SELECT 1 FROM generate_series(1, CASE
//	  WHEN pg_is_in_recovery() THEN 2
//	  WHEN current_setting('transaction_isolation') IN ('repeatable read', 'serializable')
//	    THEN set_config('txlock.isolation', '<isolationMarker>' || current_setting('transaction_isolation'), true)::int
//	  WHEN set_config('txlock.lock_timeout', current_setting('lock_timeout'), true) IS NULL THEN 0
//	  WHEN set_config('lock_timeout', '<window ms>', true) IS NULL THEN 0
//	  WHEN pg_advisory_xact_lock(k1)::text IS NULL THEN 0
//	  WHEN pg_advisory_xact_lock(k2)::text IS NULL THEN 0 ...
//	  WHEN set_config('lock_timeout', current_setting('txlock.lock_timeout', true), true) IS NULL THEN 0
//	  ELSE 1 END)
//
// A transaction above ReadCommitted is refused before any wait, with an
// error (22P02) that carries isolationMarker (read uncommitted, which
// PostgreSQL runs as read committed, is not refused): its snapshot, taken by this
// statement, would predate the previous holder's commit, and fn would not
// see that holder's writes. WithTxOptions above ReadCommitted is refused
// before the database is touched; this catches a level that comes from
// the server (default_transaction_isolation) or, in LockTx, the caller.
//
// CASE evaluates its branches in order, so lock_timeout is set before the
// waits and, once every lock is granted, set back to what it was: fn's own
// statements see the transaction's lock_timeout unchanged. The keys are
// taken one by one in canonical order, so two WithLocks calls cannot
// deadlock each other. When the window passes, the wait fails with
// lock_timeout (55P03), which aborts the transaction: the attempt rolls back
// (releasing any lock it was granted) and counts as busy. If lock_timeout
// fires as the lock is granted, PostgreSQL either reports the grant or
// reports the error and, with the rollback, releases the lock: never both.
// With a hold bound, the granted branch sets
// idle_in_transaction_session_timeout too.
func waitStatement(keys []Key, shared bool, maxHold, window time.Duration) string {
	fn := "pg_advisory_xact_lock("
	if shared {
		fn = "pg_advisory_xact_lock_shared("
	}
	b := make([]byte, 0, 384+len(keys)*(len(fn)+64))
	b = append(b, "SELECT 1 FROM generate_series(1, CASE WHEN pg_is_in_recovery() THEN 2"+
		" WHEN current_setting('transaction_isolation') IN ('repeatable read', 'serializable')"+
		" THEN set_config('txlock.isolation', '"+isolationMarker+"' || current_setting('transaction_isolation'), true)::int"...)
	b = appendHoldBound(b, maxHold, " THEN 0")
	b = append(b, " WHEN set_config('txlock.lock_timeout', current_setting('lock_timeout'), true) IS NULL THEN 0"+
		" WHEN set_config('lock_timeout', '"...)
	b = strconv.AppendInt(b, ceilMillis(window), 10)
	b = append(b, "', true) IS NULL THEN 0"...)
	for _, k := range keys {
		b = append(b, " WHEN "...)
		b = append(b, fn...)
		b = appendSQLArgs(b, k)
		b = append(b, ")::text IS NULL THEN 0"...)
	}
	b = append(b, " WHEN set_config('lock_timeout', current_setting('txlock.lock_timeout', true), true) IS NULL THEN 0 ELSE 1 END)"...)
	return string(b)
}

// appendHoldBound appends, for a hold bound, a CASE branch that sets
// idle_in_transaction_session_timeout for the transaction. set_config
// returns the value, never NULL, so the branch's result (then) is never
// taken.
func appendHoldBound(b []byte, maxHold time.Duration, then string) []byte {
	if maxHold <= 0 {
		return b
	}
	b = append(b, " WHEN set_config('idle_in_transaction_session_timeout', '"...)
	b = strconv.AppendInt(b, ceilMillis(maxHold), 10)
	b = append(b, "', true) IS NULL"...)
	return append(b, then...)
}

// ceilMillis is d in whole milliseconds, rounded up.
func ceilMillis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
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
