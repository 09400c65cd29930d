package txlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/txlock/txlock/driver"
)

// The campaign and the start of a term: the options a term takes, its wait
// for the lock (WithLock's loop, with database/sql's or a driver's
// attempts), and its first
// moments once granted (its context, its fencing token, the first
// heartbeat). term.go holds the Term and its end.

// acquireTerm is AcquireTerm's, with try TryAcquireTerm's: a term on db,
// whose attempts database/sql makes. lockerOpts are a Locker's options, if
// the call is a Locker's.
func acquireTerm(ctx context.Context, db DB, key Key, lockerOpts []Option, opts []TermOption, try bool) (*Term, error) {
	t := &Term{key: key}
	t.own = ownTx{c: &t.c, db: db}
	if err := t.setup(lockerOpts, opts); err != nil {
		return nil, err
	}
	return t.campaign(ctx, &t.own, try)
}

// DriverTerm is AcquireTerm, or with try TryAcquireTerm, for a term whose
// attempts a driver makes (package driver): how a driver package such as
// pgxlock reuses txlock's terms. Each attempt's transaction must be a
// driver.TermTx. lockerOpts are the options of the driver's Locker, if the
// call is one of its methods (nil otherwise): an error about one of them
// says that it was given to New. opts follow them.
func DriverTerm(ctx context.Context, a driver.Acquirer, key Key, try bool, lockerOpts []Option, opts ...TermOption) (*Term, error) {
	t := &Term{key: key}
	t.drv = driverAcquirer{a: a, c: &t.c}
	if err := t.setup(lockerOpts, opts); err != nil {
		return nil, err
	}
	return t.campaign(ctx, &t.drv, try)
}

// queueName names the local queue of t's candidates, given their statement
// stmt: stmt itself, or without the holder's label (WithOwner), so that
// candidates with different labels queue together.
func (t *Term) queueName(stmt string) string {
	if t.c.owner == "" {
		return stmt
	}
	return termStatement(t.key, t.hb.TTL, "")
}

// setup reads a term's options: asTerm's defaults, then the Locker's, then
// the call's.
func (t *Term) setup(lockerOpts []Option, opts []TermOption) error {
	all := make([]Option, 0, 2+len(lockerOpts)+len(opts))
	all = append(all, asTerm)
	if lockerOpts != nil {
		all = append(append(all, lockerOpts...), fromLocker)
	}
	c := &t.c
	if err := c.init(append(all, termOptions(opts)...), false); err != nil {
		return err
	}
	t.hb = c.heartbeat.withDefaults()
	return nil
}

// termTx implements source.
func (a *ownTx) termTx(st *lockState) (driver.TermTx, error) {
	st.db, st.tx = a.db, a.held.tx
	return &a.held, nil
}

// termTx implements source: the driver's transaction, if it is a
// driver.TermTx.
func (d *driverAcquirer) termTx(st *lockState) (driver.TermTx, error) {
	tx := st.held.tx
	tt, ok := tx.(driver.TermTx)
	if !ok {
		_ = tx.Rollback()
		tx.Close()
		return nil, fmt.Errorf("%w: the driver's transaction is no driver.TermTx: the driver supports no terms", ErrInvalidArgument)
	}
	d.sessionOf(st, tt)
	return tt, nil
}

// campaign checks a's arguments and t's key, waits for the lock with a's attempts, and
// starts the term.
func (t *Term) campaign(ctx context.Context, a source, try bool) (*Term, error) {
	c, st := &t.c, &t.st
	if err := a.check(); err != nil {
		return nil, err
	}
	if err := t.key.Err(); err != nil {
		return nil, err
	}
	st.lock = Lock{Keys: []Key{t.key}, Held: true}
	if err := a.plan(&t.p, st.lock.Keys, 0, termStatement(t.key, t.hb.TTL, c.owner)); err != nil {
		return nil, err
	}
	t.p.bound = t.hb.TTL
	var q *ticket
	if !try {
		if h := a.queueHandle(); h != nil {
			q = &t.q
			q.key = queueKey{handle: h, stmt: t.queueName(t.p.stmt)}
		}
	}
	t.ev.start(c.obs, ctx)
	st.ev = t.ev.orNil()
	if c.fencing {
		// The term's start draws its token: set the draw's connection
		// aside while the campaign holds nothing (see WithFencing).
		d, reserved, err := reserveFor(ctx, c, st.ev, st.lock.Keys, a)
		if err != nil {
			return nil, err
		}
		st.reserved = reserved
		defer func() { st.draw = nil; d.release() }()
		st.draw = d
	}
	ta := termAttempter{a: t.p.a}
	p := t.p
	p.a = &ta
	acquired, err := lockLoop(ctx, c, c.waitMode(try), &p, nil, q, st)
	if acquired {
		t.h = &st.held
		t.tx, err = a.termTx(st)
	}
	if !acquired || err != nil {
		if q != nil {
			q.leave()
		}
		return nil, err
	}
	if q != nil && !q.entered() {
		// The lock was granted at the first attempt, before the call
		// queued: take the turn now if nobody of this process has it, so
		// that candidates of this process wait in the queue, without
		// polling, for as long as the term lasts. (enter with an ended
		// context never waits.)
		q.enter(endedCtx, nil)
	}
	t.queued = q != nil
	t.start = ta.sent
	if err := t.open(ctx); err != nil {
		t.finish(ctx, err)
		return nil, err
	}
	t.stop, t.beatDone = make(chan struct{}), make(chan struct{})
	t.begun.Store(true)
	go t.beat()
	return t, nil
}

// fromLocker comes between a Locker's options and a call's in the Locker's
// term methods: it records which of the options a term refuses the
// Locker's New set, so that the error says where they came from.
func fromLocker(c *config) {
	for _, r := range c.termRefusals() {
		c.fromNew = append(c.fromNew, r.name)
	}
}

// endedCtx is a context that has ended.
var endedCtx = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// termAttempter is a term's attempter: its plan's attempts, and the time
// the last one began, from which the term's expiry counts.
type termAttempter struct {
	a    attempter
	sent time.Time
}

func (ta *termAttempter) Attempt(ctx context.Context, r driver.Request) (driver.Result, error) {
	ta.sent = time.Now()
	return ta.a.Attempt(ctx, r)
}

// open sets up the granted term: its context, and its fencing token.
func (t *Term) open(ctx context.Context) error {
	h := t.h
	// The term's context answers Value lookups through the context the
	// Observer returned for Acquired (a hold span, say), and ends with the
	// transaction's.
	parent := ctx
	if ev := t.st.ev; ev != nil && ev.ctx != nil {
		parent = ev.ctx
	}
	base, cancel := context.WithCancelCause(parent)
	t.cancel = cancel
	txCtx := h.txCtx
	t.stopTie = context.AfterFunc(txCtx, func() { cancel(context.Cause(txCtx)) })
	t.tc = termContext{Context: base, t: t}
	st := &t.st
	st.Context = &t.tc
	// No heartbeat runs yet, and the draw may wait for a free connection
	// of the pool: a watchdog ends the term at its local expiry, which
	// cancels what is in flight, and is set again for the new expiry once
	// the token's check has proved the lock alive.
	var watchMu sync.Mutex
	watching := true
	var watchdog *time.Timer
	watchMu.Lock()
	watchdog = time.AfterFunc(t.hb.localTTL()-t.since(), func() {
		t.checkExpiry()
		watchMu.Lock()
		defer watchMu.Unlock()
		if watching && !t.losing.Load() {
			watchdog.Reset(t.hb.localTTL() - (t.since() - time.Duration(t.lastOK.Load())))
		}
	})
	watchMu.Unlock()
	stopWatching := func() {
		watchMu.Lock()
		defer watchMu.Unlock()
		watching = false
		watchdog.Stop()
	}
	defer stopWatching()
	// ended explains an error that came as the term's context ended (the
	// watchdog, or ctx): with the cause first, which errors.Is finds.
	ended := func(what string, err error) error {
		if base.Err() == nil {
			return nil
		}
		return fmt.Errorf("%w (%s: %w)", context.Cause(base), what, err)
	}
	drawn := t.since()
	seq, err := t.c.fencer.sequence()
	if err != nil {
		return err
	}
	token, err := drawToken(st, st, seq)
	if err != nil {
		if e := ended("drawing the fencing token", err); e != nil {
			return e
		}
		if SQLState(err) == "42P01" {
			err = fmt.Errorf("%w (create the sequence with Fencer.CreateSequence, or migrations/0001_txlock_fence_seq.sql)", err)
		}
		return fmt.Errorf("txlock: term of %s: %w", t.key, err)
	}
	t.token.Store(token)
	// The token's check ran on the term's transaction after drawn. The
	// first heartbeat follows at once, rather than an interval later.
	t.lastOK.Store(int64(drawn))
	sent := t.since()
	if err := t.tx.Exec(st, heartbeatStatement); err != nil {
		if e := ended("the first heartbeat", err); e != nil {
			return e
		}
		return fmt.Errorf("%w: term of %s (token %d): the first heartbeat failed: %w", ErrLockLost, t.key, token, err)
	}
	t.lastOK.Store(int64(sent))
	stopWatching()
	if base.Err() != nil {
		// The watchdog fired, or ctx ended, as the heartbeat returned.
		return context.Cause(base)
	}
	return nil
}
