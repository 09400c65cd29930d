package txlock

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/txlock/txlock/driver"
)

// DriverLockTx is LockTx, or with try TryLockTx, in a caller's transaction
// that a driver reaches through tx: how pgxlock's LockTx reuses txlock's.
func DriverLockTx(ctx context.Context, tx driver.Execer, key Key, try bool, opts ...Option) (acquired bool, err error) {
	return lockTx(ctx, tx, key, try, opts)
}

// driverAcquirer is a driver's Acquirer as a call's source and keeper;
// the loop makes the Acquirer's attempts itself (plan.a).
type driverAcquirer struct {
	a     driver.Acquirer
	c     *config
	begin string // the BEGIN of the call's transactions
}

var _ source = (*driverAcquirer)(nil)

func (d *driverAcquirer) hold(st *lockState, pass func()) error {
	d.sessionOf(st, st.held.tx)
	return st.held.runFn(st, pass)
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

// check implements source.
func (d *driverAcquirer) check() error {
	if isNil(d.a) {
		return fmt.Errorf("%w: the driver's acquirer is nil", ErrInvalidArgument)
	}
	return nil
}

// queueHandle implements source: the driver's pool, if it has one.
func (d *driverAcquirer) queueHandle() any {
	if pool := d.a.Pool(); pool != (driver.PoolKey{}) {
		return pool
	}
	return nil
}

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

// plan implements source. A driver's attempts send BEGIN, with the call's
// transaction options, and the lock statement together: the plan has
// both, and the two in one string.
func (d *driverAcquirer) plan(p *plan, keys []Key, first int, stmt string) error {
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
	*p = plan{c: c, a: d.a, keys: keys, first: first, begin: d.begin}
	if stmt == "" { // one allocation: the statement is the query's tail
		p.query = lockStatement(p.spec(formOwnTx), formOwnTx, d.begin, "; ")
	} else {
		p.query = d.begin + "; " + stmt
	}
	p.stmt = p.query[len(d.begin)+2:]
	return nil
}
