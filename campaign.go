package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"
)

// The campaign and the start of a term: the options a term takes, its wait
// for the lock (WithLock's loop, with ownTx's attempts), and its first
// moments once granted (its context, its fencing token, the first
// heartbeat). term.go holds the Term and its end.

// acquireTerm validates the call, campaigns, and starts the term.
func acquireTerm(ctx context.Context, db DB, key Key, opts []Option, try bool) (*Term, error) {
	t := &Term{key: key}
	c, a := &t.c, &t.a
	all := make([]Option, 0, len(opts)+1)
	all = append(append(all, asTerm), opts...)
	if err := c.init(all, false); err != nil {
		return nil, err
	}
	if err := c.termOptions(); err != nil {
		return nil, err
	}
	if nilDB(db) {
		return nil, fmt.Errorf("%w: db is nil", ErrInvalidArgument)
	}
	if err := key.Err(); err != nil {
		return nil, err
	}
	t.hb = c.heartbeat.withDefaults()
	*a = ownTx{c: c, db: db, keys: []Key{key}, stmt: termStatement(key, t.hb.TTL), attemptBound: t.hb.TTL}
	c.ev.start(ctx)
	var q *ticket
	if h := queueHandle(db); h != nil && !try {
		q = &t.q
		q.key = queueKey{handle: h, stmt: a.stmt}
		a.pool, _ = h.(*sql.DB)
	}
	st := &t.st
	st.lock = Lock{Keys: a.keys, Held: true}
	if c.ev.on() {
		st.ev = &c.ev
	}
	if c.fencing {
		// The term's start draws its token: set the draw's connection
		// aside while the campaign holds nothing (see WithFencing).
		d, err := reserveFor(ctx, c, a.keys, a)
		if err != nil {
			return nil, err
		}
		defer func() { st.draw = nil; d.release() }()
		st.draw = d
	}
	ta := termAttempter{a: a}
	err := c.wait(ctx, c.waitMode(try), &st.lock, &ta, q)
	if err != nil {
		if q != nil {
			q.leave()
		}
		if try && errors.Is(err, errBusy) {
			return nil, nil
		}
		return nil, err
	}
	if q != nil && !q.entered() {
		// The lock was granted at the first attempt, before the call
		// queued: take the turn now if nobody of this process has it, so
		// that candidates of this process wait in the queue, without
		// polling, for as long as the term lasts. (enter with an ended
		// context never waits.)
		q.enter(endedCtx)
	}
	t.queued = q != nil
	t.start = ta.sent
	if c.ev.on() {
		st.grantedAt = a.h.grantedAt
	}
	if err := t.begin(ctx); err != nil {
		t.finish(ctx, err)
		return nil, err
	}
	t.stop, t.beatDone = make(chan struct{}), make(chan struct{})
	t.begun.Store(true)
	go t.beat()
	return t, nil
}

// termOptions refuses the options that do not apply to a term, and sets the
// term's transaction options.
func (c *config) termOptions() error {
	var errs []error
	for _, r := range c.termRefusals() {
		err := fmt.Errorf("%w: %s", ErrInvalidArgument, r.why)
		if slices.Contains(c.fromNew, r.name) {
			err = fmt.Errorf("%w (%s was given to New, which sets it for every call of the Locker: build a Locker without it for terms)", err, r.name)
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Read committed whatever the server's default_transaction_isolation
	// says, and read only: the term's transaction makes no writes.
	c.txOpts = &sql.TxOptions{Isolation: sql.LevelReadCommitted, ReadOnly: true}
	return nil
}

// termRefusal is an option that a term refuses: its name, and the error's
// text.
type termRefusal struct{ name, why string }

// termRefusals lists the options set in c that a term refuses.
func (c *config) termRefusals() []termRefusal {
	var r []termRefusal
	refuse := func(name, why string) {
		r = append(r, termRefusal{name, name + " does not apply to a term: " + why})
	}
	if c.shared {
		refuse("WithShared", "a term is exclusive")
	}
	if c.serverWait != nil {
		refuse("WithServerWait", "its waiter holds a connection, and a candidate must hold none while it waits")
	}
	if c.maxHold > 0 {
		refuse("WithMaxHold", "a term lasts as long as its heartbeats succeed; bound a frozen holder with WithHeartbeat's TTL")
	}
	if c.failOpen {
		refuse("WithFailOpen", "a term without the lock would be no term")
	}
	if c.serialSet {
		refuse("WithSerializationRetries", "a term runs no fn in its transaction")
	}
	switch o := c.txOpts; {
	case o == nil || o.Isolation == sql.LevelDefault || o.Isolation == sql.LevelReadCommitted:
	case o.Isolation < sql.LevelReadCommitted:
		r = append(r, termRefusal{"WithTxOptions", fmt.Sprintf("a term needs ReadCommitted, and WithTxOptions asks for %v: a term's transaction is always begun READ COMMITTED; leave the option out, or ask for ReadCommitted", o.Isolation)})
	default:
		r = append(r, termRefusal{"WithTxOptions", fmt.Sprintf("a term needs ReadCommitted, and WithTxOptions asks for %v: a transaction above it keeps its snapshot, and holds back vacuum, for the whole term", o.Isolation)})
	}
	return r
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

// termAttempter is a term's attempter: ownTx's attempts, and the time the
// last one began, from which the term's expiry counts.
type termAttempter struct {
	a    *ownTx
	sent time.Time
}

func (ta *termAttempter) attempt(ctx context.Context, b bound) (outcome, error) {
	ta.sent = time.Now()
	return ta.a.attempt(ctx, b)
}

// begin sets up the granted term: its context, and its fencing token.
func (t *Term) begin(ctx context.Context) error {
	h := &t.a.h
	// The term's context answers Value lookups through the context the
	// Observer returned for Acquired (a hold span, say), and ends with the
	// transaction's.
	parent := ctx
	if t.c.ev.on() && t.c.ev.ctx != nil {
		parent = t.c.ev.ctx
	}
	base, cancel := context.WithCancelCause(parent)
	t.cancel = cancel
	txCtx := h.txCtx
	t.stopTie = context.AfterFunc(txCtx, func() { cancel(context.Cause(txCtx)) })
	t.tc = termContext{Context: base, t: t}
	st := &t.st
	st.Context, st.db, st.tx = &t.tc, t.a.db, t.a.held.tx
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
	if _, err := t.a.held.tx.ExecContext(st, heartbeatStatement); err != nil {
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
