package txlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/txlock/txlock/driver"
)

// Terms: a lock held for longer than one critical section (a leader among
// a service's replicas, a job that commits in batches), in one transaction
// that makes no writes, kept alive by heartbeats. A term is acquired like a
// WithLock call (the same wait loop, attempter and local queue), then held
// by a Term, whose goroutine sends the heartbeats and ends the term when one
// fails or none succeeds for the TTL.

// WithTermFencer sets the Fencer a term draws its fencing token from (the
// zero Fencer's sequence without it). Inside WithLock's fn, call the
// Fencer's Token method instead.
func WithTermFencer(f Fencer) TermOption {
	return termOption(func(c *config) {
		if _, err := f.sequence(); err != nil {
			c.fail("WithTermFencer: %s", trimPrefix(err))
		}
		c.fencer = f
	})
}

// asTerm is the first option of every term call: it marks the call, and
// sets the defaults in which a campaign differs from WithLock, which the
// caller's options may then override.
func asTerm(c *config) {
	c.term = true
	c.timeout = 1<<63 - 1 // a campaign lasts until elected, or until ctx ends
	c.retry = ExponentialBackoff{Min: campaignBackoffMin, Max: campaignBackoffMax}
}

// Term is a term of a lock: the advisory lock of one key, held by one
// READ COMMITTED transaction that makes no writes, for as long as its
// heartbeats succeed (see Heartbeat), until Release, or until the context
// given to AcquireTerm ends. Get one with AcquireTerm or TryAcquireTerm, or
// let Lead manage it (pgxlock has the same three, on pgx). Its methods are
// safe for concurrent use.
//
// What a term costs: one connection for its whole length (behind PgBouncer
// in transaction mode, one server connection, pinned: size the pool for
// it), one heartbeat statement per interval, and, at its start, a fencing
// token drawn on another connection of the pool: without WithFencing, the
// pool needs a connection to spare when a term starts, or the start fails
// at once with ErrNoToken; with it, one connection is set aside for draws
// while the term campaigns and starts. Its transaction holds no snapshot between statements and is
// given no transaction id, so it holds back no vacuum, however long it
// lasts.
//
// A term can be lost without the holder being told in time (a terminated
// backend is noticed by the next heartbeat; a pause longer than the TTL, on
// the holder's return): two holders can overlap for a while, so a write
// made outside the term's transaction must carry Token, so that the
// resource refuses a holder whose term has passed (see FencedTable). A
// resource refuses the old token only once the successor has written its
// own there: a successor should write its token to each resource it will
// use first, before it acts on what the resource says.
type Term struct {
	key   Key
	token atomic.Int64 // set once, before AcquireTerm returns; atomic for the expiry checks of database/sql's goroutines

	c   config
	ev  events         // the term's events: st.ev points to them, if it has an Observer
	own ownTx          // the attempts of AcquireTerm, on database/sql
	drv driverAcquirer // DriverTerm's, a driver's
	p   plan           // how the campaign's attempts are made
	h   *holder        // the granted lock: st.held
	tx  driver.TermTx  // its transaction
	q   ticket
	st  lockState   // Context(): the lock, db, tx, and the fencing token
	tc  termContext // st's Context
	hb  Heartbeat

	cancel  context.CancelCauseFunc // ends tc's context, with the term's cause
	stopTie func() bool             // unties the term from the transaction's context
	queued  bool                    // q is in its local queue, and must leave it

	// start is the send time of the lock statement, on the monotonic
	// clock; lastOK is when the last successful heartbeat (or the lock
	// statement, 0) was sent, in nanoseconds after start.
	start  time.Time
	lastOK atomic.Int64
	losing atomic.Bool // the term's context has been (or is being) cancelled as lost

	begun    atomic.Bool   // AcquireTerm is returning the term: it was handed out
	stop     chan struct{} // closed by Release: the heartbeat goroutine returns, and Release ends the term
	stopOnce sync.Once
	beatDone chan struct{} // closed once the heartbeat goroutine has returned

	endMu    sync.Mutex
	finished bool
}

// termContext is a term's context: base, whose Done, Err and Value first
// check the term's local expiry, so that a holder that was frozen past the
// TTL finds its context cancelled the moment it looks. Contexts derived
// from it with a cancel of their own register on base, and do not check:
// Held does, as fn's context is an ownTerm.
type termContext struct {
	context.Context
	t *Term
}

// Done implements context.Context.
func (c *termContext) Done() <-chan struct{} {
	c.t.checkExpiry()
	return c.Context.Done()
}

// Err implements context.Context.
func (c *termContext) Err() error {
	c.t.checkExpiry()
	return c.Context.Err()
}

// Value implements context.Context. context.Cause looks its answer up
// through Value, so it too sees an expiry.
func (c *termContext) Value(key any) any {
	c.t.checkExpiry()
	return c.Context.Value(key)
}

// String implements fmt.Stringer.
func (c *termContext) String() string { return "txlock.termContext" }

// AcquireTerm campaigns for the exclusive lock key until it is granted,
// then starts a term and returns it: see Term. The caller must end the term
// with Release.
//
// The campaign is WithLock's wait: each attempt begins a transaction and
// runs one statement; a busy attempt rolls back at once, so a candidate
// holds no connection between attempts, and sleeps as WithRetry says
// (ExponentialBackoff{Min: 10 * time.Millisecond, Max: 500 *
// time.Millisecond} by default). Candidates of this process on the
// same db and key queue locally, in FIFO order, and the turn passes to the
// next one when a term ends. The campaign lasts until the lock is granted or
// ctx ends, unless WithTimeout bounds it (ErrLockTimeout). It ends, too, at
// the first error that is not about the lock: a connection error, or a
// server in recovery (ErrStandby); campaign again in a loop (see Lead). Each
// attempt is bounded by the TTL: one that has not returned by then (a
// pooled connection that a partition holds up, a server that accepts no
// connection) is cut off, which closes its connection, and ends the
// campaign with an error that says so, rather than leaving the candidate
// stuck until TCP gives up.
//
// The granted lock's transaction is READ COMMITTED and READ ONLY: it runs
// the lock statement, which also sets idle_in_transaction_session_timeout
// to the TTL and turns off transaction_timeout (PostgreSQL 17 and later)
// for the transaction, then the heartbeats, and nothing else. Once the lock
// is granted, a fencing token is drawn durably from the zero Fencer's
// sequence (or WithTermFencer's), as Fencer.Token does: db must be a pool
// with a connection to spare for the draw (see Term and WithFencing), and
// the sequence must
// exist (Fencer.CreateSequence). The term's start (the draw, its check on
// the term's transaction, the first heartbeat) is bounded by the TTL: past
// it, AcquireTerm fails with an error matching ErrLockLost.
//
// ctx bounds the term as BeginTx's context bounds a transaction: when it
// ends, so does the term. Bound the campaign with WithTimeout rather than
// with a context that ends once AcquireTerm has returned.
//
// Options: WithTimeout, WithRetry, WithObserver, WithHeartbeat and
// WithTermFencer apply; WithTxOptions is accepted only for ReadCommitted (or
// the default level). WithShared, WithServerWait (whose waiter holds a
// connection), WithMaxHold (the heartbeat bounds a term), WithFailOpen and
// WithSerializationRetries are refused with ErrInvalidArgument, and so, by
// the Locker's methods, is a Locker whose New was given one of them.
func AcquireTerm(ctx context.Context, db DB, key Key, opts ...TermOption) (*Term, error) {
	return acquireTerm(ctx, db, key, nil, opts, false)
}

// TryAcquireTerm makes one attempt at key, and starts a term if the lock is
// granted, as AcquireTerm does. If another session holds the lock, it
// returns a nil Term and a nil error. It never queues or waits.
func TryAcquireTerm(ctx context.Context, db DB, key Key, opts ...TermOption) (*Term, error) {
	return acquireTerm(ctx, db, key, nil, opts, true)
}

// Lead campaigns for key as AcquireTerm does and, once elected, runs fn
// with the term, and a context that is cancelled when a heartbeat detects
// the term's loss (up to Interval+Timeout after the server dropped the
// lock; within the TTL for a frozen holder), with a cause matching
// ErrLockLost, or when ctx ends. Two holders can overlap in that window:
// fence every write outside the term's transaction (Term.Token). When fn
// returns, the term is released at once: the next candidate is elected at
// its next poll. If fn panics, the term is released and the panic
// continues.
//
// Lead returns fn's error, joined with the term's loss (ErrLockLost) if the
// term was lost before fn returned and fn's error does not already carry
// it; or the campaign's error (ErrLockTimeout with WithTimeout, ErrStandby,
// a connection error), with fn not run.
//
// One call is one term. To stay a candidate for as long as the service
// runs, call Lead in a loop, and decide there what follows a term: whether
// fn's return means "done" or "campaign again", and how long to pause
// after an error. A pause after a term that fn ended itself lets the other
// candidates win the next one:
//
//	for ctx.Err() == nil {
//		err := txlock.Lead(ctx, db, key, run)
//		switch {
//		case errors.Is(err, txlock.ErrLockLost): // lost: campaign again at once
//		case err != nil && ctx.Err() == nil: // the campaign failed (a failover?): pause, then campaign again
//			time.Sleep(time.Second)
//		}
//	}
//
// Inside fn, ctx is also a txlock fn context: FenceToken(ctx) returns the
// term's token, and LockFromContext and Held describe the term.
func Lead(ctx context.Context, db DB, key Key, fn func(ctx context.Context, t *Term) error, opts ...TermOption) error {
	if fn == nil {
		return errNilLeadFn
	}
	t, err := acquireTerm(ctx, db, key, nil, opts, false)
	if err != nil {
		return err
	}
	return t.lead(ctx, fn)
}

// DriverLead is Lead for a term whose attempts a driver makes: see
// DriverTerm.
func DriverLead(ctx context.Context, a driver.Acquirer, key Key, fn func(ctx context.Context, t *Term) error, lockerOpts []Option, opts ...TermOption) error {
	if fn == nil {
		return errNilLeadFn
	}
	t, err := DriverTerm(ctx, a, key, false, lockerOpts, opts...)
	if err != nil {
		return err
	}
	return t.lead(ctx, fn)
}

var errNilLeadFn = fmt.Errorf("%w: fn is nil", ErrInvalidArgument)

// lead runs Lead's fn with the term t, and releases it.
func (t *Term) lead(ctx context.Context, fn func(ctx context.Context, t *Term) error) error {
	done := false
	defer func() {
		if !done { // fn panicked: release, and let the panic continue.
			_ = t.Release(context.WithoutCancel(ctx))
		}
	}()
	fnErr := fn(t.Context(), t)
	done = true
	lost := t.Err()
	relErr := t.Release(context.WithoutCancel(ctx))
	switch {
	case errors.Is(lost, ErrLockLost):
		if errors.Is(fnErr, lost) { // fn returned context.Cause(ctx), or wrapped it
			return fnErr
		}
		return errors.Join(fnErr, lost)
	case fnErr != nil:
		return fnErr
	}
	return relErr
}

// fenceToken implements ownTerm.
func (c *termContext) fenceToken(seq string) (int64, error) { return c.t.fenceToken(seq) }

// fenceToken is Fencer.Token on the term's context, for the sequence seq:
// the term's own token, drawn when it began. A second draw is never made:
// its check would run on the term's transaction, alongside a heartbeat.
func (t *Term) fenceToken(seq string) (int64, error) {
	if err := t.Err(); err != nil {
		return 0, fmt.Errorf("%w: the term has ended: %w", ErrNoToken, err)
	}
	own, err := t.c.fencer.sequence()
	if err != nil {
		return 0, err
	}
	if seq != own {
		return 0, fmt.Errorf("%w: a term's context carries only the term's token, drawn from %s, the sequence of the term's Fencer (WithTermFencer's, or the zero Fencer's), and this Fencer's sequence is %s: use Term.Token, or the term's Fencer", ErrNoToken, own, seq)
	}
	return t.token.Load(), nil
}

// lose cancels the term's context with err; the first cause is kept. It
// returns once the context is cancelled, by this call or a concurrent one,
// and never blocks on the database: the heartbeat goroutine ends the term's
// transaction.
func (t *Term) lose(err error) {
	t.losing.Store(true)
	t.cancel(err)
}

// finish ends the term, once: cancels its context with cause (a context
// already cancelled keeps its first cause), rolls its transaction back,
// leaves the local queue, and reports TermLost (for a term that was handed
// out) and Released. It returns the rollback's error when a release (the
// term's first cause) may have left the lock held.
func (t *Term) finish(ctx context.Context, cause error) error {
	t.endMu.Lock()
	defer t.endMu.Unlock()
	if t.finished {
		return nil
	}
	t.finished = true
	st := &t.st
	st.ended.Store(true)
	t.losing.Store(true)
	if t.cancel != nil {
		t.cancel(cause)
		cause = context.Cause(t.tc.Context)
	}
	h := t.h
	// A ROLLBACK is as short as a heartbeat, and is bounded the same way:
	// by the Heartbeat's Timeout (and never past the TTL), and by ctx
	// (Release's). Ending the rollback's context cuts off a rollback stuck
	// on a partitioned connection, and closes it; the server ends the
	// session within the TTL. A ctx that has already ended cuts it off
	// before it is sent.
	rctx, cutRollback := context.WithCancelCause(context.WithoutCancel(ctx))
	var cutMu sync.Mutex
	var cutErr error
	cut := func(why string) {
		cutMu.Lock()
		defer cutMu.Unlock()
		if cutErr == nil {
			cutErr = fmt.Errorf("the rollback was cut off, as %s, and its connection closed", why)
			cutRollback(fmt.Errorf("txlock: the rollback of the term of %s: %w: %w", t.key, cutErr, cause))
		}
	}
	if ctx.Err() != nil {
		cut("Release's ctx had ended")
	} else {
		bound := min(t.hb.Timeout, t.hb.localTTL())
		timer := time.AfterFunc(bound, func() { cut(fmt.Sprintf("it had not returned after %v", bound)) })
		stop := context.AfterFunc(ctx, func() { cut("Release's ctx ended") })
		defer func() { timer.Stop(); stop() }()
	}
	rbErr := t.tx.RollbackContext(rctx)
	t.tx.Close()
	cutMu.Lock()
	wasCut := cutErr
	cutMu.Unlock()
	ended := errors.Is(rbErr, driver.ErrFnEndedTx) || errors.Is(rbErr, driver.ErrRolledBack)
	switch {
	case rbErr == nil:
	case wasCut != nil && ended:
		rbErr = wasCut // the cut ended the transaction's context, and the driver rolled back, and closed the connection
	case wasCut != nil:
		rbErr = fmt.Errorf("%w: %w", wasCut, rbErr)
	case ended:
		rbErr = nil // the transaction's context ended (ctx, or a loss), and the driver rolled it back
	}
	cutRollback(nil)
	if t.stopTie != nil {
		t.stopTie()
	}
	if h.cancel != nil {
		h.cancel(nil)
	}
	if t.queued {
		t.q.leave()
	}
	if st.ev != nil {
		e := Event{Keys: st.lock.Keys, Attempts: st.lock.Attempts, Waited: st.lock.Waited, Held: t.c.clock.now().Sub(st.grantedAt), Token: t.token.Load()}
		if t.begun.Load() && errors.Is(cause, ErrLockLost) {
			// Only a term that AcquireTerm returned can be lost: one whose
			// start failed is reported by Released, with the error.
			e.Kind, e.Err = TermLost, cause
			st.ev.report(e)
		}
		e.Kind, e.Err, e.Token = Released, cause, 0
		if errors.Is(cause, ErrTermReleased) {
			e.Err = rbErr
		}
		st.ev.report(e)
	}
	if rbErr != nil && errors.Is(cause, ErrTermReleased) {
		// A term that was lost, or whose context ended, has no session to
		// roll back: only a release reports its rollback.
		return fmt.Errorf("txlock: releasing the term of %s: %w; the server ends the lock when it ends the session (at once if the connection's close reaches it, within the TTL otherwise)", t.key, rbErr)
	}
	return nil
}

// Key returns the term's key.
func (t *Term) Key() Key { return t.key }

// Token returns the term's fencing token, drawn durably when the term
// began: larger than the token of every term of the same Fencer's sequence
// that began before it. Writes made outside the term's transaction (to
// another table, database or service) must carry it, so that the resource
// refuses them once a later term has written (FencedTable).
func (t *Term) Token() int64 { return t.token.Load() }

// Context returns the term's context: it is cancelled when the term ends
// (for a loss, when the loss is detected: see Heartbeat), and context.Cause
// then says why: an error matching ErrLockLost, or ErrTermReleased, or the
// cause of the context given to AcquireTerm. It is also a txlock fn
// context: FenceToken returns the term's token from it (a Fencer whose
// sequence is not the term's gets ErrNoToken), LockFromContext and Held
// describe the term. Held checks the term's local expiry on contexts
// derived from this one too; their own Err and Done do not (see Heartbeat).
func (t *Term) Context() context.Context { return &t.st }

// Done returns a channel that is closed when the term ends.
func (t *Term) Done() <-chan struct{} { return t.tc.Done() }

// Err returns nil while the term holds its lock, and then why it ended: an
// error matching ErrLockLost if the term was lost, ErrTermReleased after
// Release, or the cause of the context given to AcquireTerm.
func (t *Term) Err() error {
	if t.tc.Err() == nil {
		return nil
	}
	return context.Cause(t.tc.Context)
}

// Release ends the term: it rolls the term's transaction back, which
// releases the lock at once, so the next candidate is elected at its next
// poll. It waits for a heartbeat in flight and then the rollback (each at
// most the Heartbeat's Timeout), or, if ctx ends first, cuts them off,
// which closes the connection; a ctx that has already ended sends no
// rollback. Release returns nil once the lock is released, by this call or
// before it by the term's loss or the end of AcquireTerm's ctx (which Err
// reports; the server ends a lost term's session within the TTL), and an
// error if the rollback failed or was cut off. It may be called more than
// once.
func (t *Term) Release(ctx context.Context) error {
	t.stopOnce.Do(func() { close(t.stop) })
	select {
	case <-t.beatDone:
	case <-ctx.Done():
		t.cancel(ErrTermReleased)
		<-t.beatDone
	}
	return t.finish(ctx, ErrTermReleased)
}

// AcquireTerm is AcquireTerm on the Locker's db.
func (l *Locker) AcquireTerm(ctx context.Context, key Key, opts ...TermOption) (*Term, error) {
	return acquireTerm(ctx, l.db, key, l.opts, opts, false)
}

// TryAcquireTerm is TryAcquireTerm on the Locker's db.
func (l *Locker) TryAcquireTerm(ctx context.Context, key Key, opts ...TermOption) (*Term, error) {
	return acquireTerm(ctx, l.db, key, l.opts, opts, true)
}

// Lead is Lead on the Locker's db.
func (l *Locker) Lead(ctx context.Context, key Key, fn func(ctx context.Context, t *Term) error, opts ...TermOption) error {
	if fn == nil {
		return errNilLeadFn
	}
	t, err := acquireTerm(ctx, l.db, key, l.opts, opts, false)
	if err != nil {
		return err
	}
	return t.lead(ctx, fn)
}

// trimPrefix drops the package prefix of err's text, for an option's error,
// which gets the prefix of ErrInvalidArgument.
func trimPrefix(err error) string {
	const p = "txlock: "
	s := err.Error()
	if len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}
