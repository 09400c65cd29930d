package txlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txlock/txlock/driver"
)

// This file is the lock loop (lockLoop): how one call makes attempts until
// the lock is granted, the deadline passes, or the context ends, then runs
// fn under the lock. It knows nothing of database/sql: it drives an
// attempter (attempt.go), the seam through which every way of acquiring (a
// transaction of txlock's own, a driver's, a caller's transaction) plugs in,
// and a keeper (hold.go), which runs fn under the granted lock.

// waitMode is how a call waits for a busy lock.
type waitMode uint8

const (
	polling  waitMode = iota // sleep as the RetryStrategy says between attempts
	inServer                 // wait in the server's lock queue, a window per attempt (WithServerWait)
	tryOnce                  // one attempt; a busy lock ends the call with errBusy
)

// waitMode is how a call of these options waits for a busy lock: try
// makes one attempt.
func (c *config) waitMode(try bool) waitMode {
	switch {
	case try:
		return tryOnce
	case c.serverWait != nil:
		return inServer
	}
	return polling
}

// lockLoop is the lock algorithm, for every call, in one function. p says
// how the attempts are made. For the WithLock family h runs fn under the
// granted lock; for LockTx and a term's campaign h is nil, and the loop
// ends at the grant: the lock is the caller's to keep (st.held).
//
//   - Wait: attempt until the lock is granted. After a busy attempt, sleep
//     as the RetryStrategy says (polling), wait in the server again
//     (inServer), or end with errBusy (tryOnce): mode, see config.waitMode.
//     If t is not nil, the call queues locally behind the callers of this
//     process that wait for the same keys (queue.go), and attempts only
//     while it has the turn. The wait ends by its deadline, or with ctx: a
//     *LockTimeoutError or a *CanceledError (waitEnded).
//   - Hold: run fn under the lock, then commit or roll back (holder.runFn).
//   - Retry: after fn's serialization failure, sleep, and go round again
//     with a new wait (WithSerializationRetries).
//   - Fail open: once the wait timed out, run fn without the lock
//     (WithFailOpen).
//
// st is the first round's fn context, whose lock field says what is locked.
// The events are reported by the waiter (waiter.event: WaitStarted and Busy
// as they happen, the wait's end at its exits) and by the hold's end
// (config.released, config.runUnlocked).
func lockLoop(ctx context.Context, c *config, mode waitMode, p *plan, h keeper, t *ticket, st *lockState) (bool, error) {
	w := &waiter{c: c, mode: mode, p: p, t: t}
	holding := false // fn runs: if it panics, the lock's end is reported
	defer func() {   // one defer, which the compiler open-codes
		if holding {
			c.released(st, errFnPanicked)
		}
		w.wc.stop()
		if h != nil {
			t.leave()
			if st.draw != nil {
				st.draw.release()
			}
		}
	}()
	if h != nil && c.fencing {
		var err error
		if st.draw, st.reserved, err = reserveFor(ctx, c, st.ev, st.lock.Keys, h); err != nil {
			return false, err
		}
	}
	var fnErr error // the last round's result, once fn has run
	for round := 0; ; round++ {
		werr := w.startWait(ctx, st)
	wait:
		for werr == nil {
			w.b.window = w.window()
			req, ab := p.request(ctx, w.b)
			r, err := w.attempt(ctx, req)
			out, err := p.settle(ctx, st, ab, r, err)
			out, werr = w.sort(ctx, out, err)
			switch {
			case werr != nil || out == again:
				continue
			case out == granted:
				break wait
			case mode == tryOnce:
				werr = w.exit(Skipped, errBusy)
			case !w.pause(ctx):
				werr = w.giveUp(ctx)
			}
		}
		switch {
		case werr == nil:
		case round > 0:
			// fn has run, and failed: that is the call's result, whatever
			// stopped the retry.
			return true, errors.Join(fnErr, retryNotRun(ctx, werr))
		case errors.Is(werr, errBusy):
			return false, nil
		case h != nil && c.failOpen && mode != tryOnce && reachedDeadline(werr):
			w.wc.stop()
			t.leave()
			return false, c.runUnlocked(ctx, h, st)
		default:
			return false, werr
		}
		if h == nil {
			return true, nil
		}
		pass := w.endWait(ctx, st, h)
		holding = true
		err := h.hold(st, pass)
		holding = false
		t.leave()
		c.released(st, err)
		if round >= c.serialRetries || !retryable(err) {
			return true, err
		}
		fnErr = err
		if !c.clock.sleep(ctx, c.backoff(round+1)) {
			return true, errors.Join(err, retryNotRun(ctx, ctx.Err()))
		}
		w.event(SerializationRetry, err)
		// Each round has its own state: a context that fn kept from an
		// earlier round keeps describing that round's lock.
		st = &lockState{lock: Lock{Keys: st.lock.Keys, Shared: st.lock.Shared, Held: true, Slots: st.lock.Slots}, draw: st.draw, reserved: st.reserved, ev: st.ev}
	}
}

// waiter is the state of one call's waits, a wait a round. The loop owns
// it; config, what the options said, does not change during the call.
type waiter struct {
	c     *config
	mode  waitMode
	p     *plan
	t     *ticket // the call's place in its local queue, or nil
	lock  *Lock   // the round's lock
	start time.Time
	b     bound   // the next attempt's
	wc    waitCtx // b.waitCtx, once needed
	ev    *events // the call's events, if it has an Observer (lockState.ev)
	// ctxEnd is the caller's context's deadline, if any: a window ends
	// windowMargin before it too, as the context's end would end the
	// statement.
	ctxEnd time.Time
	// cost is the least that an attempt's round trips have taken, beyond
	// its window, in this call; 0 until measured (see attempt).
	cost time.Duration
	// headWindow: the default's windows as the queue's head
	// (config.headWindow) are the call's to make; a server that refuses
	// them is polled for the rest of the wait.
	headWindow bool
}

// startWait starts a round's wait for st's lock: its WaitStarted event, its
// deadline, and the local queue, where the call may wait for its turn
// before its first attempt. A non-nil error ends the wait.
func (w *waiter) startWait(ctx context.Context, st *lockState) error {
	c := w.c
	w.lock, w.start = &st.lock, c.clock.now()
	w.headWindow = c.headWindow && w.mode == polling
	w.wc.stop()
	w.wc = waitCtx{}
	w.ev = st.ev
	w.ctxEnd, _ = ctx.Deadline()
	w.event(WaitStarted, nil)
	if err := ctx.Err(); err != nil {
		if w.mode == tryOnce && !errors.Is(err, context.Canceled) {
			return w.exit(Failed, fmt.Errorf("txlock: %s not attempted: %w", keysString(w.lock.Keys), err))
		}
		return w.giveUp(ctx)
	}
	timeout := c.timeout
	if st.reserved > 0 { // what setting a draw connection aside took of it
		timeout = max(timeout-st.reserved, time.Millisecond)
	}
	w.b = bound{deadline: w.start.Add(timeout)}
	// A ServerWait call queues before its first attempt, which may wait in
	// the server: only the queue's head should. A polling call does so only
	// if others are queued already, so as not to overtake them, or, with
	// the default strategy, if its lock was busy recently: its first
	// attempt can then be its window in the server.
	if t := w.t; t != nil && (w.mode == inServer || t.othersQueued() || w.headWindow && t.hot(w.start)) && !w.enter(ctx) {
		return w.giveUp(ctx)
	}
	return nil
}

// sort counts an attempt, and says what its result means for the wait:
// granted, busy, or again (attempt at once), or an error that ends the
// wait, reported as its event.
func (w *waiter) sort(ctx context.Context, out outcome, err error) (outcome, error) {
	if err != nil && w.b.window > 0 && w.mode == polling && isIsolationError(err) {
		// The server's default isolation is above ReadCommitted: the
		// window was refused before it waited. Poll instead.
		w.headWindow = false
		return again, nil
	}
	w.tookHandoff(out, err)
	if err != nil {
		if !w.endedBy(ctx, err) {
			return busy, w.exit(Failed, lockError(w.lock.Keys, err))
		}
		if w.b.window > 0 {
			// The wait ended while the statement waited in the server:
			// that window was an attempt, and found the lock busy for as
			// long as it lasted.
			w.lock.Attempts++
			w.event(Busy, nil)
		}
		return busy, w.giveUp(ctx)
	}
	w.lock.Attempts++
	switch out {
	case granted:
		return granted, w.exit(Acquired, nil)
	case standby:
		return standby, w.exit(StandbyRefused, fmt.Errorf("%w (lock %s)", ErrStandby, keysString(w.lock.Keys)))
	}
	w.event(Busy, nil)
	if w.headWindow && w.t != nil {
		w.t.markBusy(w.c.clock.now())
	}
	return busy, nil
}

// endWait ends the wait (its context), readies st for fn under the lock
// that h was granted, and returns the handoff that fn's return makes: the
// next caller of the local queue
// may start as soon as fn is done, when each caller has a connection of its
// own (see queue.go); nil if there is none.
func (w *waiter) endWait(ctx context.Context, st *lockState, h keeper) (pass func()) {
	w.wc.stop()
	if ev := st.ev; ev != nil && ev.ctx != ctx {
		st.obsCtx = ev.ctx
	}
	t := w.t
	switch {
	case t == nil || !t.entered() || !h.pooled():
		return nil
	case w.mode == inServer:
		return t.passNow
	case w.headWindow && t.passAtGrant():
		return t.markHandoff
	}
	return t.passAtReturn
}

// window is how long the next attempt may wait in the server's lock queue:
// every attempt's window with ServerWait; with the default strategy, every
// attempt of the local queue's head, for one key, when the pool has an
// idle connection; else 0. The default's window is DefaultServerWaitWindow
// at every attempt, with its strategy's pause between: a caller that fell
// back to polling after one window would lose every release to the windows
// that other processes keep queued in the server, and time out
// (TestFleetNoStarvation). A handoff from this process's holder (prevEnd)
// leaves the lock free for a cheaper poll once the holder's transaction has ended,
// unless other processes wait for it in the server (queue.remote), or the
// last handoff took longer than slowHandoff (a network between the process
// and the server): the window then goes at once, without waiting for that
// end (see bound.waitFor), queues behind the holder, and is granted the
// moment the holder's transaction ends. Only a single key waits:
// lock_timeout bounds each key's wait, so a window over several keys could
// last a window per key, holding the keys it has. A window ends
// windowMargin, and the call's measured round trips (cost), before the
// wait's deadline or the context's, whichever is first, so that the
// server's answer comes before that deadline ends the attempt's
// transaction ("How a wait ends" in docs/waiting.md).
func (w *waiter) window() time.Duration {
	t := w.t
	d := time.Duration(0)
	switch {
	case w.mode == inServer:
		d = w.c.serverWait.window()
	case w.headWindow && len(w.lock.Keys) == 1 && t != nil && t.entered() && (w.b.prevEnd == nil || t.q.remote || t.handoffSlow()) && idleConn(w.p.a):
		d = DefaultServerWaitWindow
	default:
		return 0
	}
	return max(min(d, w.left()-windowMargin-w.cost), time.Millisecond)
}

// left is the time left until the wait's deadline, or the caller's
// context's, whichever comes first.
func (w *waiter) left() time.Duration {
	end := w.b.deadline
	if !w.ctxEnd.IsZero() && w.ctxEnd.Before(end) {
		end = w.ctxEnd
	}
	return end.Sub(w.c.clock.now())
}

// attempt makes the attempt of req, and measures its cost: how long it
// took beyond its window (a busy window returns when its window has
// passed), the round trips of its BEGIN and its statement. A window, and
// an attempt after a pause, are then fitted in before the deadline with
// that cost to spare, so that across a network the answer still comes
// before the deadline, which would end the statement (on database/sql, at
// the price of the connection). The least cost seen is kept: an attempt
// that first waited for a connection, or for the previous holder's end,
// took longer than its round trips.
func (w *waiter) attempt(ctx context.Context, req driver.Request) (driver.Result, error) {
	start := time.Now()
	r, err := w.p.a.Attempt(ctx, req)
	if c := time.Since(start) - req.Window; err == nil && r.Err == nil && req.PrevEnd == nil && c > 0 && (w.cost == 0 || c < w.cost) {
		w.cost = c
	}
	return r, err
}

// windowMargin is how long before the wait's deadline a window ends: the
// time the server's answer takes to arrive after its lock_timeout, on a
// local network. Without it, a call that timed out on database/sql lost
// its connection (TestTimeoutKeepsConnection). It is a variable only so
// that a test can change it (export_test.go).
var windowMargin = 25 * time.Millisecond

// tookHandoff notes an attempt that waited for the previous holder's end
// before its lock statement (prevEnd): later attempts need not, and giving
// up now passes nothing on. A poll that found the lock busy right after a
// handoff shows that other processes wait for it in the server.
func (w *waiter) tookHandoff(out outcome, err error) {
	if err != nil || w.b.prevEnd == nil {
		return
	}
	if w.b.window == 0 && w.headWindow {
		w.t.q.remote = out == busy
	}
	w.b.prevEnd, w.t.prevEnd = nil, nil
}

// endedBy reports whether an attempt's error is the wait's own end. A
// connection error that happens to arrive after the deadline stays what it
// is (and never triggers WithFailOpen).
func (w *waiter) endedBy(ctx context.Context, err error) bool {
	return ctx.Err() != nil || !w.c.clock.now().Before(w.b.deadline) && isContextErr(err)
}

// lockError explains an attempt's error: 53200 is out_of_memory, which from
// a lock statement is the shared lock table ("out of shared memory").
func lockError(keys []Key, err error) error {
	if SQLState(err) == codeOutOfMemory {
		return fmt.Errorf("%w (SQLSTATE 53200) while locking %s: raise max_locks_per_transaction, or lock fewer keys at once: %w", ErrLockTableFull, keysSummary(keys), err)
	}
	return err
}

// pause follows a busy attempt: it enters the local queue, if the call has
// not yet, or sleeps as the strategy says. It reports false if the wait
// ended first.
func (w *waiter) pause(ctx context.Context) bool {
	c := w.c
	d := c.backoff(w.lock.Attempts)
	if d < 0 {
		return false
	}
	if w.t != nil && !w.t.entered() {
		// When the turn comes, the holder of this process, if any, has
		// just let go: the next attempt follows at once.
		return w.enter(ctx)
	}
	w.b.waitCtx = w.wc.get(ctx, w.b.deadline)
	if left := w.left(); d+w.cost >= left || w.b.window > 0 && left <= windowMargin+w.cost {
		// No time for another attempt, or a window ended windowMargin
		// before the deadline (see window): the wait ends there, or with
		// the caller's context if that ends first.
		c.clock.sleep(w.b.waitCtx, w.b.deadline.Sub(c.clock.now()))
		return false
	}
	return c.clock.sleep(w.b.waitCtx, d)
}

// enter waits for the turn in the local queue, until the deadline. With
// the default strategy, for one key (whose head may wait in the server),
// an earlyBeginner begins its transaction on deck (ticket.callOnDeck).
func (w *waiter) enter(ctx context.Context) bool {
	w.b.waitCtx = w.wc.get(ctx, w.b.deadline)
	var early func()
	if e, ok := w.p.a.(earlyBeginner); ok && w.headWindow && len(w.lock.Keys) == 1 {
		early = func() { e.beginEarly(ctx, w.b) }
		e.afterBegin(w.t.callOnDeck)
	}
	if !w.t.enter(w.b.waitCtx, early) {
		return false
	}
	w.b.prevEnd = w.t.prevEnd
	return true
}

// exit ends the wait with err, and reports its end as an event of kind.
func (w *waiter) exit(kind EventKind, err error) error {
	w.lock.Waited = w.c.clock.now().Sub(w.start)
	w.event(kind, err)
	return err
}

// giveUp ends the wait at its deadline, or with ctx: see waitEnded.
func (w *waiter) giveUp(ctx context.Context) error {
	w.lock.Waited = w.c.clock.now().Sub(w.start)
	kind, err := waitEnded(ctx, w.lock.Keys, w.lock.Slots, w.lock.Attempts, w.lock.Waited)
	w.event(kind, err)
	return err
}

// event reports an event of the wait, if the call has an Observer.
func (w *waiter) event(kind EventKind, err error) {
	ev := w.ev
	if ev == nil {
		return
	}
	e := Event{Kind: kind, Keys: w.lock.Keys, Shared: w.lock.Shared, CallerTx: w.c.inTx, Attempts: w.lock.Attempts, Err: err, Slots: w.lock.Slots, Slot: w.lock.Slot}
	switch kind {
	case WaitStarted, SerializationRetry:
	case Busy:
		e.Waited = w.c.clock.now().Sub(w.start)
	default:
		e.Waited = w.lock.Waited
	}
	ev.emit(e)
}

// idleConn reports whether a's pool has an idle connection, which a window
// in the server takes without opening one or waiting for one
// (driver.Acquirer's IdleConn).
func idleConn(a attempter) bool {
	p, ok := a.(interface{ IdleConn() bool })
	return ok && p.IdleConn()
}

// waitCtx is the wait's context, made on first use.
type waitCtx struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// get returns the context, ending at deadline or with parent.
func (w *waitCtx) get(parent context.Context, deadline time.Time) context.Context {
	if w.ctx == nil {
		w.ctx, w.cancel = context.WithDeadline(parent, deadline)
	}
	return w.ctx
}

func (w *waitCtx) stop() {
	if w.cancel != nil {
		w.cancel()
	}
}

// backoff is how long to sleep after n busy attempts: a negative duration
// means stop trying.
func (c *config) backoff(n int) time.Duration {
	if c.serverWait != nil {
		return jitter(c.serverWait.Pause)
	}
	return c.retry.Backoff(n)
}
