package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/txlock/txlock/driver"
)

// DriverLock runs a call of the WithLock family whose attempts a driver
// makes (package driver): WithLock, or for several keys, taken all or
// nothing, WithLocks; with try, TryWithLock or TryWithLocks. It is how a
// driver package such as pgxlock reuses txlock's lock loop, with the same
// options, local queues, events, fencing tokens and errors; users call the
// driver package's functions. keys and opts are checked as WithLock checks
// them, before a's first attempt; a single key's slice is not kept.
func DriverLock(ctx context.Context, a driver.Acquirer, keys []Key, try bool, opts ...Option) (acquired bool, err error) {
	dc := &driverCall{}
	c := &dc.c
	if err := c.init(opts, false); err != nil {
		return false, err
	}
	if isNil(a) {
		return false, fmt.Errorf("%w: the driver's acquirer is nil", ErrInvalidArgument)
	}
	if keys, err = driverKeys(keys, &dc.one); err != nil {
		return false, err
	}
	dc.st0.lock = Lock{Keys: keys, Shared: c.shared, Held: true, Slots: c.slots}
	if keys, err = c.semaphoreKeys(keys); err != nil {
		return false, err
	}
	dc.a = driverAcquirer{a: a, c: c, keys: keys}
	if err := dc.a.plan(); err != nil {
		return false, err
	}
	c.ev.start(ctx)
	var t *ticket
	if pool := a.Pool(); !try && !c.shared && pool != (driver.PoolKey{}) {
		t = &dc.t
		t.key = queueKey{handle: pool, stmt: c.queueStmt(keys, dc.a.query, dc.a.begin, "; "), serverWait: c.serverWait != nil, slots: c.slots}
	}
	return lockLoop(ctx, c, c.waitMode(try), &dc.a, &dc.a, t, &dc.st0)
}

// DriverLockTx is LockTx, or with try TryLockTx, in a caller's transaction
// that a driver reaches through tx: how pgxlock's LockTx reuses txlock's.
func DriverLockTx(ctx context.Context, tx driver.Execer, key Key, try bool, opts ...Option) (acquired bool, err error) {
	a := &callerTx{tx: tx}
	if err := a.c.init(opts, true); err != nil {
		return false, err
	}
	if isNil(tx) {
		return false, fmt.Errorf("%w: tx is nil", ErrInvalidArgument)
	}
	return a.lock(ctx, key, try)
}

// driverCall is the state of one driver call, in one allocation.
type driverCall struct {
	c   config
	a   driverAcquirer
	t   ticket
	st0 lockState
	one [1]Key
}

// driverAcquirer is a driver's Acquirer as the lock loop's acquirer.
type driverAcquirer struct {
	a     driver.Acquirer
	c     *config
	keys  []Key
	begin string // the BEGIN of the call's transactions
	stmt  string // a polling attempt's lock statement: the WithLock family's, or a term's
	query string // begin and stmt, in one string
	h     holder // the granted lock
	slot  int    // for a semaphore, the slot granted
	// attemptBound, if not 0, bounds each attempt, as ownTx's does.
	attemptBound time.Duration
}

var _ acquirer = (*driverAcquirer)(nil)

func (d *driverAcquirer) attempt(ctx context.Context, b bound) (outcome, error) {
	at := driver.Request{Begin: d.begin, Stmt: d.stmt, Query: d.query, Deadline: b.deadline, WaitCtx: b.waitCtx, PrevEnd: b.waitFor()}
	if b.window > 0 {
		at.Window, at.Stmt = b.window, quietWaitStatement(d.c.spec(d.keys, formOwnTx), b.window)
		at.Query = d.begin + "; " + at.Stmt
	}
	var bounded time.Time // the attempt's bound, if it comes before the wait's deadline
	if d.attemptBound > 0 {
		if end := time.Now().Add(d.attemptBound); end.Before(at.Deadline) {
			parent := at.WaitCtx
			if parent == nil {
				parent = ctx
			}
			var cancel context.CancelFunc
			at.WaitCtx, cancel = context.WithDeadline(parent, end)
			defer cancel()
			at.Deadline, bounded = end, end
		}
	}
	r, err := d.a.Attempt(ctx, at)
	if err != nil {
		if !bounded.IsZero() && !time.Now().Before(bounded) {
			err = overran(d.attemptBound, err)
		}
		return busy, err
	}
	tx := r.Tx
	out := granted
	switch {
	case r.Err != nil:
		if !isNil(tx) { // the contract says it has none; end it anyway
			_ = tx.Rollback()
			tx.Close()
		}
		// Every error of a statement in a transaction of the call's own,
		// a window's end and a deadlock among them.
		return classifyOwn(r.Err)
	case isNil(tx):
		return busy, errors.New("txlock: the driver's attempt returned neither a transaction nor an error")
	default:
		out, err = d.c.outcome(r.Rows, &d.slot)
	}
	switch {
	case out != granted || err != nil:
	case ctx.Err() != nil:
		// ctx ended as the lock was granted: fn must not start.
		out, err = busy, ctx.Err()
	case !bounded.IsZero() && !time.Now().Before(bounded):
		// The grant came after the attempt's bound (the driver cuts the
		// connection off only a little later): as ownTx does, the attempt
		// has failed.
		out, err = busy, overran(d.attemptBound, context.DeadlineExceeded)
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
	if d.c.ev.on() {
		d.h.grantedAt = d.c.clock.now()
	}
	if d.c.maxHold > 0 {
		d.h.bound(d.c.maxHold)
	}
	return granted, nil
}

func (d *driverAcquirer) hold(st *lockState, handOn func()) error {
	d.sessionOf(st, d.h.tx)
	if st.ev != nil {
		st.grantedAt = d.h.grantedAt // before the hold bound started
	}
	return d.h.runFn(st, handOn)
}

func (d *driverAcquirer) holdUnlocked(ctx context.Context, st *lockState) error {
	tx, err := d.a.BeginUnlocked(ctx, d.begin)
	if err != nil {
		return err
	}
	d.sessionOf(st, tx)
	h := &holder{tx: tx, txCtx: ctx, fnCtx: ctx}
	return h.runFn(st, nil)
}

// sessionOf makes tx the session that st's fencing tokens use, if it is
// one.
func (d *driverAcquirer) sessionOf(st *lockState, tx driver.Tx) {
	if s, ok := tx.(driver.Session); ok {
		st.sess = s
	} else {
		st.sess = noSession{}
	}
}

// noSession is the session of a driver's transaction that is no
// driver.Session: it draws no fencing token.
type noSession struct{}

func (noSession) DrawRow(context.Context, string, ...any) error { return errNoSession }
func (noSession) LockRow(context.Context, string, ...any) error { return errNoSession }

var errNoSession = fmt.Errorf("%w: the driver's transaction is no driver.Session, which fencing tokens need", ErrNoToken)

func (d *driverAcquirer) pooled() bool { return d.a.Pool() != driver.PoolKey{} }

// drawPool implements drawPooler with the driver's Drawer.
func (d *driverAcquirer) drawPool() (any, func(context.Context) (drawConn, error), error) {
	p, ok := d.a.(driver.Drawer)
	if !ok {
		return nil, nil, fmt.Errorf("%w: WithFencing is not supported by this driver", ErrInvalidArgument)
	}
	open, err := p.OpenDraw()
	if err != nil {
		return nil, nil, err
	}
	if d.a.Pool() == (driver.PoolKey{}) {
		return nil, nil, fmt.Errorf("%w: WithFencing sets a connection of a pool aside for fencing tokens, and the driver was given one session", ErrInvalidArgument)
	}
	return d.a.Pool(), func(ctx context.Context) (drawConn, error) {
		c, err := open(ctx)
		if err != nil {
			return nil, err
		}
		return driverDrawConn{c}, nil
	}, nil
}

// driverDrawConn is a driver's DrawConn as a drawConn.
type driverDrawConn struct{ c driver.DrawConn }

func (d driverDrawConn) drawRow(ctx context.Context, query string, dest ...any) error {
	return d.c.DrawRow(ctx, query, dest...)
}

func (d driverDrawConn) exec(ctx context.Context, query string) error { return d.c.Exec(ctx, query) }

// close gives the connection back; the driver closes it if it is not idle
// (see driver.DrawConn), whatever discard says.
func (d driverDrawConn) close(bool) { d.c.Close() }

// idleConn reports whether the driver's pool has an idle connection, for
// the default strategy's window in the server (see config.headWindow).
func (d *driverAcquirer) idleConn() bool { return d.a.IdleConn() }

func (d *driverAcquirer) grantedSlot() int { return d.slot }

// plan builds what the call sends: its BEGIN, and its polling attempt's
// lock statement (a term's, or the WithLock family's), and the two in one
// string.
func (d *driverAcquirer) plan() error {
	c := d.c
	d.begin = "BEGIN"
	if o := c.txOpts; o != nil {
		switch o.Isolation {
		case sql.LevelDefault:
		case sql.LevelReadUncommitted:
			d.begin += " ISOLATION LEVEL READ UNCOMMITTED"
		case sql.LevelReadCommitted:
			d.begin += " ISOLATION LEVEL READ COMMITTED"
		case sql.LevelRepeatableRead:
			d.begin += " ISOLATION LEVEL REPEATABLE READ"
		case sql.LevelSerializable:
			d.begin += " ISOLATION LEVEL SERIALIZABLE"
		default:
			return fmt.Errorf("%w: WithTxOptions: PostgreSQL has no isolation level %v", ErrInvalidArgument, o.Isolation)
		}
		if o.ReadOnly {
			d.begin += " READ ONLY"
		}
	}
	if d.stmt == "" { // one allocation: the statement is the query's tail
		d.query = lockStatement(c.spec(d.keys, formOwnTx), formOwnTx, d.begin, "; ")
	} else {
		d.query = d.begin + "; " + d.stmt
	}
	d.stmt = d.query[len(d.begin)+2:]
	return nil
}

// driverKeys checks a driver call's keys. A single key is copied to one,
// so that the driver's slice is not kept.
func driverKeys(keys []Key, one *[1]Key) ([]Key, error) {
	if len(keys) != 1 {
		return canonicalKeys(keys)
	}
	if err := keys[0].Err(); err != nil {
		return nil, err
	}
	one[0] = keys[0]
	return one[:], nil
}
