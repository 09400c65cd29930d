package txlock

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/txlock/txlock/internal/seam"
)

// This file plugs the driver packages (pgxlock) into the lock loop, through
// internal/seam: a driver makes the attempts, and the loop decides their
// outcomes and runs fn; the
// options, the local queues and the events stay the ones of
// WithLock.

func init() {
	seam.Run = runDriver
	seam.LockTx = lockTxDriver
}

// driverCall is the state of one driver call, in one allocation.
type driverCall struct {
	c   config
	a   driverAcquirer
	t   ticket
	st0 lockState
	one [1]Key
}

// driverAcquirer is a driver's seam.Acquirer as the lock loop's acquirer.
type driverAcquirer struct {
	a    seam.Acquirer
	c    *config
	keys []Key
	h    holder // the granted lock
}

var _ acquirer = (*driverAcquirer)(nil)

func (d *driverAcquirer) attempt(ctx context.Context, b bound) (outcome, error) {
	sb := seam.Bound{Deadline: b.deadline, WaitCtx: b.waitCtx, Window: b.window, PrevEnd: b.prevEnd}
	if b.window > 0 {
		sb.WaitStmt = waitStatement(d.keys, d.c.shared, d.c.maxHold, b.window)
	}
	r, err := d.a.Attempt(ctx, sb)
	if err != nil {
		return busy, err
	}
	out := granted
	switch {
	case r.Err != nil:
		// Every error of a statement in a transaction of the call's own,
		// a window's end and a deadlock among them.
		return classifyOwn(r.Err)
	case b.window > 0:
		out, err = rowsOutcome(r.Rows)
	}
	tx := r.Tx
	if out == granted && err == nil && ctx.Err() != nil {
		// ctx ended as the lock was granted: fn must not start.
		out, err = busy, ctx.Err()
	}
	if out != granted || err != nil {
		_ = tx.Rollback()
		tx.Close()
		return out, err
	}
	// The driver's transaction has no context of its own: fn's statements
	// end with fn's context, which the hold bound, if any, ends (and the
	// server's side of the bound ends the session).
	d.h = holder{tx: tx, txCtx: ctx, fnCtx: ctx}
	if d.c.maxHold > 0 {
		d.h.bound(d.c.maxHold)
	}
	return granted, nil
}

func (d *driverAcquirer) hold(st *lockState, handOn func()) error {
	d.sessionOf(st, d.h.tx)
	return d.h.runFn(st, handOn)
}

func (d *driverAcquirer) holdUnlocked(ctx context.Context, st *lockState) error {
	tx, err := d.a.BeginUnlocked(ctx)
	if err != nil {
		return err
	}
	d.sessionOf(st, tx)
	h := &holder{tx: tx, txCtx: ctx, fnCtx: ctx}
	return h.runFn(st, nil)
}

// sessionOf makes tx the session that st's fencing tokens use, if it is
// one.
func (d *driverAcquirer) sessionOf(st *lockState, tx seam.Tx) {
	st.sess, _ = tx.(seam.Session)
}

func (d *driverAcquirer) pooled() bool { return d.a.Pooled() }

// drawPool implements drawPooler with the driver's DrawPool.
func (d *driverAcquirer) drawPool() (any, func(context.Context) (drawConn, error), error) {
	p, ok := d.a.(seam.DrawPool)
	if !ok {
		return nil, nil, fmt.Errorf("%w: WithFencing is not supported by this driver", ErrInvalidArgument)
	}
	h, open, err := p.DrawPool()
	if err != nil {
		return nil, nil, err
	}
	return h, func(ctx context.Context) (drawConn, error) {
		c, err := open(ctx)
		if err != nil {
			return nil, err
		}
		return driverDrawConn{c}, nil
	}, nil
}

// driverDrawConn is a driver's DrawConn as a drawConn.
type driverDrawConn struct{ c seam.DrawConn }

func (d driverDrawConn) drawRow(ctx context.Context, query string, dest ...any) error {
	return d.c.DrawRow(ctx, query, dest...)
}

func (d driverDrawConn) close() { d.c.Close() }

// idleConn reports whether the driver's pool has an idle connection, for
// the default strategy's window in the server (see config.headWindow).
func (d *driverAcquirer) idleConn() bool { return d.a.IdleConn() }

// runDriver implements seam.Run: WithLock's validation and lock loop, with
// the driver's acquirer.
func runDriver(ctx context.Context, r *seam.Request) (bool, error) {
	dc := &driverCall{}
	c := &dc.c
	opts, ok := r.Opts.([]Option)
	if !ok && r.Opts != nil {
		return false, fmt.Errorf("%w: options of type %T", ErrInvalidArgument, r.Opts)
	}
	if err := c.init(opts, false); err != nil {
		return false, err
	}
	keys, err := driverKeys(r.Multi, r.Key, r.Keys, &dc.one)
	if err != nil {
		return false, err
	}
	dc.a = driverAcquirer{a: r.A, c: c, keys: keys}
	if r.Plan, err = driverPlan(c, keys); err != nil {
		return false, err
	}
	c.ev.start(ctx)
	var t *ticket
	if !r.Try && !c.shared && r.Queue != nil {
		t = &dc.t
		t.key = queueKey{handle: r.Queue, stmt: r.Plan.Query, serverWait: c.serverWait != nil}
	}
	return lockLoop(ctx, c, c.waitMode(r.Try), &dc.a, keys, t, &dc.st0)
}

// driverPlan builds what a driver call sends: its BEGIN, and its polling
// query, which is the lock statement (formFailBusy) and the BEGIN in one
// string. The lock statement comes first, so that a busy lock ends the
// query before the BEGIN and leaves the connection in no transaction,
// unless the transaction has an explicit isolation level: PostgreSQL
// refuses to set one once a query has run in the transaction, so BEGIN
// then comes first, and a busy attempt leaves the transaction aborted,
// for the driver to roll back.
func driverPlan(c *config, keys []Key) (seam.Plan, error) {
	p := seam.Plan{Begin: "BEGIN"}
	if o := c.txOpts; o != nil {
		level := ""
		switch o.Isolation {
		case sql.LevelDefault:
		case sql.LevelReadUncommitted:
			level = " ISOLATION LEVEL READ UNCOMMITTED"
		case sql.LevelReadCommitted:
			level = " ISOLATION LEVEL READ COMMITTED"
		case sql.LevelRepeatableRead:
			level = " ISOLATION LEVEL REPEATABLE READ"
		case sql.LevelSerializable:
			level = " ISOLATION LEVEL SERIALIZABLE"
		default:
			return p, fmt.Errorf("%w: WithTxOptions: PostgreSQL has no isolation level %v", ErrInvalidArgument, o.Isolation)
		}
		p.Begin += level
		if o.ReadOnly {
			p.Begin += " READ ONLY"
		}
		p.BeginFirst = level != ""
	}
	if p.BeginFirst {
		p.Query = p.Begin + "; " + lockStatement(keys, c.shared, c.maxHold, formFailBusy)
	} else {
		p.Query = lockStatement(keys, c.shared, c.maxHold, formFailBusy, "; "+p.Begin)
	}
	return p, nil
}

// driverKeys checks a driver call's keys: key, or with multi, keys.
func driverKeys(multi bool, key, keys any, one *[1]Key) ([]Key, error) {
	if multi {
		ks, ok := keys.([]Key)
		if !ok {
			return nil, fmt.Errorf("%w: keys of type %T", ErrInvalidArgument, keys)
		}
		return canonicalKeys(ks)
	}
	k, ok := key.(*Key)
	if !ok || k == nil {
		return nil, fmt.Errorf("%w: key of type %T", ErrInvalidArgument, key)
	}
	if err := k.Err(); err != nil {
		return nil, err
	}
	one[0] = *k
	return one[:], nil
}

// lockTxDriver implements seam.LockTx: LockTx in a driver's transaction.
func lockTxDriver(ctx context.Context, r *seam.TxRequest) (bool, error) {
	opts, ok := r.Opts.([]Option)
	if !ok && r.Opts != nil {
		return false, fmt.Errorf("%w: options of type %T", ErrInvalidArgument, r.Opts)
	}
	a := &callerTx{tx: r.Tx}
	if err := a.c.init(opts, true); err != nil {
		return false, err
	}
	key, ok := r.Key.(*Key)
	if !ok || key == nil {
		return false, fmt.Errorf("%w: key of type %T", ErrInvalidArgument, r.Key)
	}
	return a.lock(ctx, *key, r.Try)
}
