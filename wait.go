package txlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/txlock/txlock/internal/seam"
)

// This file is the wait loop: how one call makes attempts until the lock is
// granted, the deadline passes, or the context ends. It knows nothing of
// database/sql: it drives an attempter, the seam through which every way of
// acquiring (a transaction of txlock's own, a caller's transaction) plugs in.

// An attempter makes lock attempts for one call.
type attempter interface {
	// attempt makes one attempt within b. Unless it reports granted, it has
	// let go of every connection it took before it returns. An attempt
	// must not outlast b.deadline.
	attempt(ctx context.Context, b bound) (outcome, error)
}

// outcome is what one attempt found: the seam's Outcome, which driver
// packages report too (see seam.go).
type outcome = seam.Outcome

const (
	busy    = seam.Busy    // another session holds a key; nothing is held
	granted = seam.Granted // every key is held, until the attempt's transaction ends
	standby = seam.Standby // the server is in recovery; nothing was locked
)

// bound is what limits one attempt.
type bound struct {
	deadline time.Time
	// waitCtx ends at deadline or with the caller's context. The wait makes
	// it only once it is needed, for the first sleep or queue: nil until
	// then, which lets an uncontended call go without it.
	waitCtx context.Context
	// window is how long the attempt may wait in the server's lock queue
	// (ServerWait), never past deadline; 0: it must not wait there.
	window time.Duration
	// prevEnd is not nil when the caller ahead in the local queue handed
	// this call its turn before that caller's transaction ended (see
	// queue.go): it is closed once that transaction has ended, and the lock
	// statement must not be sent before.
	prevEnd <-chan struct{}
}

// waitMode is how a call waits for a busy lock.
type waitMode uint8

const (
	polling  waitMode = iota // sleep as the RetryStrategy says between attempts
	inServer                 // wait in the server's lock queue, a window per attempt (WithServerWait)
	tryOnce                  // one attempt; a busy lock ends the call with errBusy
)

// clock is the wait's time seam: the real clock, except in tests.
type clock interface {
	now() time.Time
	// sleep waits for d or until ctx ends, and reports whether d elapsed.
	sleep(ctx context.Context, d time.Duration) bool
}

type realClock struct{}

func (realClock) now() time.Time                                  { return time.Now() }
func (realClock) sleep(ctx context.Context, d time.Duration) bool { return sleep(ctx, d) }

// wait makes a's attempts until one is granted, and counts them in lock.
//
// A busy attempt is followed by a sleep (polling), by another window in the
// server (inServer), or by errBusy (tryOnce). If t is not nil, the call
// queues locally behind the callers of this process that wait for the same
// keys (see queue.go), and attempts only while it has the turn. Every
// attempt and every sleep ends by the deadline: then, or when ctx ends, the
// result is what waitEnded says (a *LockTimeoutError, or a *CanceledError
// for a cancelled ctx).
func (c *config) wait(ctx context.Context, mode waitMode, lock *Lock, a attempter, t *ticket) error {
	// headWindow is the call's: a server that refuses the window is polled
	// for the rest of the wait.
	headWindow := c.headWindow && mode == polling
	start := c.clock.now()
	ev := &c.ev
	if ev.on() {
		ev.emit(Event{Kind: WaitStarted, Keys: lock.Keys, Shared: lock.Shared, CallerTx: c.inTx})
	}
	timeout := func() error {
		lock.Waited = c.clock.now().Sub(start)
		kind, err := waitEnded(ctx, lock.Keys, lock.Attempts, lock.Waited)
		if ev.on() {
			ev.emit(Event{Kind: kind, Keys: lock.Keys, Shared: lock.Shared, CallerTx: c.inTx, Attempts: lock.Attempts, Waited: lock.Waited, Err: err})
		}
		return err
	}
	failed := func(err error) error {
		if ev.on() {
			ev.emit(Event{Kind: Failed, Keys: lock.Keys, Shared: lock.Shared, CallerTx: c.inTx, Attempts: lock.Attempts, Waited: c.clock.now().Sub(start), Err: err})
		}
		return err
	}
	if err := ctx.Err(); err != nil {
		if mode == tryOnce && !errors.Is(err, context.Canceled) {
			return failed(fmt.Errorf("txlock: %s not attempted: %w", keysString(lock.Keys), err))
		}
		return timeout()
	}
	b := bound{deadline: start.Add(c.timeout)}
	var wc waitCtx
	defer wc.stop()
	// enter waits for the turn in the local queue, until the deadline.
	enter := func() bool {
		b.waitCtx = wc.get(ctx, b.deadline)
		if !t.enter(b.waitCtx) {
			return false
		}
		b.prevEnd = t.prevEnd
		return true
	}
	// A ServerWait call queues before its first attempt, which may wait in
	// the server: only the queue's head should. A polling call does so only
	// if others are queued already, so as not to overtake them, or, with
	// the default strategy, if its lock was busy recently: its first
	// attempt can then be its window in the server.
	if t != nil && (mode == inServer || t.othersQueued() || headWindow && t.hot(start)) && !enter() {
		return timeout()
	}
	headWaited := false // the call made its one window as the queue's head
	for {
		b.window = 0
		switch {
		case mode == inServer:
			b.window = max(min(c.serverWait.window(), b.deadline.Sub(c.clock.now())), time.Millisecond)
		case headWindow && mode == polling && !headWaited && len(lock.Keys) == 1 && t != nil && t.entered() && (b.prevEnd == nil || t.q.remote) && idleConn(a):
			// A handoff from this process's holder (prevEnd) leaves the
			// lock free for a cheaper poll, unless other processes wait
			// for it in the server. Only a single key waits: lock_timeout
			// bounds each key's wait, so a window over several keys could
			// last a window per key, holding the keys it has.
			b.window = max(min(DefaultServerWaitWindow, b.deadline.Sub(c.clock.now())), time.Millisecond)
			headWaited = true
		}
		out, err := a.attempt(ctx, b)
		if err != nil && mode == polling && b.window > 0 && isIsolationError(err) {
			// The server's default isolation is above ReadCommitted: the
			// window was refused before it waited. Poll instead.
			headWindow = false
			continue
		}
		if err == nil && b.prevEnd != nil {
			if b.window == 0 && headWindow {
				t.q.remote = out == busy
			}
			// The attempt waited for the previous holder's end before its
			// lock statement: later attempts need not, and giving up now
			// passes nothing on.
			b.prevEnd, t.prevEnd = nil, nil
		}
		if err != nil {
			// Only the wait's own end is a timeout: a connection error
			// that happens to arrive after the deadline stays what it is
			// (and never triggers WithFailOpen).
			if mode != tryOnce && (ctx.Err() != nil || !c.clock.now().Before(b.deadline) && isContextErr(err)) {
				if b.window > 0 {
					// The wait ended while the statement waited in the
					// server: that window was an attempt, and found the
					// lock busy for as long as it lasted.
					lock.Attempts++
					if ev.on() {
						ev.emit(Event{Kind: Busy, Keys: lock.Keys, Shared: lock.Shared, CallerTx: c.inTx, Attempts: lock.Attempts, Waited: c.clock.now().Sub(start)})
					}
				}
				return timeout()
			}
			if SQLState(err) == codeOutOfMemory {
				// 53200 is out_of_memory; from a lock statement it is the
				// shared lock table ("out of shared memory").
				err = fmt.Errorf("%w (SQLSTATE 53200) while locking %s: raise max_locks_per_transaction, or lock fewer keys at once: %w", ErrLockTableFull, keysSummary(lock.Keys), err)
			}
			return failed(err)
		}
		lock.Attempts++
		switch out {
		case granted:
			lock.Waited = c.clock.now().Sub(start)
			if ev.on() {
				ev.emit(Event{Kind: Acquired, Keys: lock.Keys, Shared: lock.Shared, CallerTx: c.inTx, Attempts: lock.Attempts, Waited: lock.Waited})
			}
			return nil
		case standby:
			if ev.on() {
				ev.emit(Event{Kind: StandbyRefused, Keys: lock.Keys, Shared: lock.Shared, CallerTx: c.inTx, Attempts: lock.Attempts, Waited: c.clock.now().Sub(start)})
			}
			return fmt.Errorf("%w (lock %s)", ErrStandby, keysString(lock.Keys))
		}
		if ev.on() {
			ev.emit(Event{Kind: Busy, Keys: lock.Keys, Shared: lock.Shared, CallerTx: c.inTx, Attempts: lock.Attempts, Waited: c.clock.now().Sub(start)})
		}
		if headWindow && t != nil {
			t.markBusy(c.clock.now())
		}
		if mode == tryOnce {
			if ev.on() {
				ev.emit(Event{Kind: Skipped, Keys: lock.Keys, Shared: lock.Shared, CallerTx: c.inTx, Attempts: lock.Attempts, Waited: c.clock.now().Sub(start)})
			}
			return errBusy
		}
		d := c.pause(lock.Attempts)
		if d < 0 {
			return timeout()
		}
		if t != nil && !t.entered() {
			if !enter() {
				return timeout()
			}
			continue // the turn came: the holder of this process, if any, just let go
		}
		b.waitCtx = wc.get(ctx, b.deadline)
		if left := b.deadline.Sub(c.clock.now()); d >= left {
			c.clock.sleep(b.waitCtx, left)
			return timeout()
		}
		if !c.clock.sleep(b.waitCtx, d) {
			return timeout()
		}
	}
}

// idleConn reports whether a's pool has an idle connection, which a window
// in the server takes without opening one or waiting for one.
func idleConn(a attempter) bool {
	p, ok := a.(interface{ idleConn() bool })
	return ok && p.idleConn()
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

// pause is how long to sleep after n busy attempts: a negative duration
// means stop trying.
func (c *config) pause(n int) time.Duration {
	if c.serverWait != nil {
		return jitter(c.serverWait.Pause)
	}
	return c.retry.Backoff(n)
}
