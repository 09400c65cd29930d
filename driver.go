package txlock

import (
	"context"
	"database/sql"
	"fmt"

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
	dc.a = driverAcquirer{a: a, c: c}
	if err := dc.a.plan(&dc.p, keys, ""); err != nil {
		return false, err
	}
	dc.ev.start(c.obs, ctx)
	dc.st0.ev = dc.ev.orNil()
	var t *ticket
	if pool := a.Pool(); !try && !c.shared && pool != (driver.PoolKey{}) {
		t = &dc.t
		t.key = queueKey{handle: pool, stmt: c.queueStmt(keys, dc.p.query, dc.p.begin, "; "), serverWait: c.serverWait != nil, slots: c.slots}
	}
	return lockLoop(ctx, c, c.waitMode(try), &dc.p, &dc.a, t, &dc.st0)
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
	ev  events
	a   driverAcquirer
	p   plan
	t   ticket
	st0 lockState
	one [1]Key
}

// driverAcquirer is what the lock loop's acquirer needs of a driver's
// Acquirer, whose attempts the loop makes itself (plan.a).
type driverAcquirer struct {
	a     driver.Acquirer
	c     *config
	begin string // the BEGIN of the call's transactions
}

var _ acquirer = (*driverAcquirer)(nil)

func (d *driverAcquirer) hold(st *lockState, handOn func()) error {
	d.sessionOf(st, st.held.tx)
	return st.held.runFn(st, handOn)
}

func (d *driverAcquirer) holdUnlocked(ctx context.Context, st *lockState) error {
	tx, err := d.a.BeginUnlocked(ctx, d.begin)
	if err != nil {
		return err
	}
	d.sessionOf(st, tx)
	h := newHolder(ctx, tx)
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

// plan makes p the plan of the call's attempts, on keys: its BEGIN, its
// polling attempt's lock statement, stmt (a term's) or if stmt is "" the
// WithLock family's, and the two in one string.
func (d *driverAcquirer) plan(p *plan, keys []Key, stmt string) error {
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
	*p = plan{c: c, a: d.a, keys: keys, begin: d.begin}
	if stmt == "" { // one allocation: the statement is the query's tail
		p.query = lockStatement(c.spec(keys, formOwnTx), formOwnTx, d.begin, "; ")
	} else {
		p.query = d.begin + "; " + stmt
	}
	p.stmt = p.query[len(d.begin)+2:]
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
