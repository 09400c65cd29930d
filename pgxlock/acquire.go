package pgxlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/driver"
)

// acquirer is the driver.Acquirer of a call: it makes the attempts on pool
// or conn.
type acquirer struct {
	pool *pgxpool.Pool // db, if it is a pool
	conn *pgx.Conn     // db, if it is one connection
	fn   func(context.Context, pgx.Tx) error

	tx0   heldTx    // the call's first transaction: see held
	batch pgx.Batch // begun's, kept here so that it costs no allocation of its own
}

var (
	_ driver.Acquirer = (*acquirer)(nil)
	_ driver.Drawer   = (*acquirer)(nil)
)

// rollbackTimeout bounds a ROLLBACK sent after fn's context ended: a
// connection that cannot roll back in that time is closed, which ends its
// transaction (and its lock) in the server too.
const rollbackTimeout = 5 * time.Second

// Attempt implements driver.Acquirer. Waiting for the previous holder, and
// taking a connection from the pool, end with the wait's context, or, when
// the wait has none yet, with a context that ends at its deadline. The
// attempt's statements run under ctx, with a deadline on the connection
// itself (see deadline and driver.StallGrace). fn runs under ctx.
func (a *acquirer) Attempt(ctx context.Context, b driver.Request) (driver.Result, error) {
	actx := b.WaitCtx
	if actx == nil {
		actx = ctx
		if d, ok := ctx.Deadline(); !ok || d.After(b.Deadline) {
			var cancel context.CancelFunc
			actx, cancel = context.WithDeadline(ctx, b.Deadline)
			defer cancel()
		}
	}
	if b.PrevEnd != nil {
		// The previous holder of this process's queue handed its turn on
		// before its transaction ended: the lock is free once it has. Wait
		// for that without a connection; taking one from the pool after
		// costs microseconds.
		select {
		case <-b.PrevEnd:
		case <-actx.Done():
			return driver.Result{}, context.Cause(actx)
		}
	}
	c, pc, err := a.connect(actx)
	if err != nil {
		return driver.Result{}, fmt.Errorf("txlock: acquiring a connection: %w", err)
	}
	reset := deadline(c, b.Deadline.Add(driver.StallGrace))
	tag, err := c.Exec(ctx, b.Query)
	reset()
	if err != nil {
		a.rollback(ctx, c)
		a.release(pc)
		if pastDeadline(err, b.Deadline) {
			return driver.Result{}, fmt.Errorf("txlock: the server did not answer the lock statement by %v after the wait's deadline: %w: %w", driver.StallGrace, context.DeadlineExceeded, err)
		}
		return driver.Result{Err: err}, nil
	}
	return driver.Result{Tx: a.held(ctx, pc, a.begun(ctx, c)), Rows: tag.RowsAffected()}, nil
}

// begun returns a pgx.Tx for the transaction that c's attempt began, without
// a round trip: the query of an attempt is BEGIN and the lock statement in
// one, which pgx's own BeginTx cannot send, as it does not return the lock
// statement's row count. A Batch begun with BeginTx and then emptied is
// sent without I/O (pgx sends nothing for an empty batch), and its
// transaction is a pgx transaction on c, whose Commit and Rollback end what
// the query began.
func (a *acquirer) begun(ctx context.Context, c *pgx.Conn) pgx.Tx {
	a.batch = emptyBegin
	br := c.SendBatch(ctx, &a.batch)
	tx := br.Tx()
	_ = br.Close()
	return tx
}

// emptyBegin is a Batch begun with BeginTx, whose BEGIN is taken out: see
// begun.
var emptyBegin = func() pgx.Batch {
	var b pgx.Batch
	b.BeginTx(pgx.TxOptions{})
	b.QueuedQueries = nil
	return b
}()

// deadline bounds the I/O of c's next statements by t, on the connection
// itself, as pgx's own context watcher does when a context ends: pgx
// watches a context only if it can end, so an uncontended call under one
// that cannot (context.Background) pays for no watch, and a stalled
// connection is still cut off (pgx then closes it).
// The returned func takes the deadline off again.
func deadline(c *pgx.Conn, t time.Time) (reset func()) {
	nc := c.PgConn().Conn()
	_ = nc.SetDeadline(t)
	return func() {
		if !c.IsClosed() {
			_ = nc.SetDeadline(time.Time{})
		}
	}
}

// pastDeadline reports an error of a connection cut off after the wait's
// deadline: pgx reports a timeout of its I/O.
func pastDeadline(err error, deadline time.Time) bool {
	var ne net.Error
	return !time.Now().Before(deadline) && (pgconn.Timeout(err) || errors.As(err, &ne) && ne.Timeout())
}

// held returns the attempt's transaction, for package txlock to decide
// on. (The server's side of the hold bound, WithMaxHold, started with the
// lock statement; package txlock starts the client's.) The call's first
// transaction is reused until fn has run in it; a later one (after a
// serialization failure) is new, since the earlier round's fn may have
// kept its context, and draw tokens on it.
func (a *acquirer) held(ctx context.Context, pc *pgxpool.Conn, tx pgx.Tx) *heldTx {
	h := &a.tx0
	if h.ran {
		h = &heldTx{}
	}
	*h = heldTx{fn: a.fn, ctx: ctx, pool: a.pool, pc: pc, tx: tx}
	return h
}

// connect returns the connection for an attempt: one of the pool's, or the
// call's own.
func (a *acquirer) connect(ctx context.Context) (*pgx.Conn, *pgxpool.Conn, error) {
	if a.pool == nil {
		return a.conn, nil, nil
	}
	pc, err := a.pool.Acquire(ctx)
	if err != nil {
		return nil, nil, err
	}
	return pc.Conn(), pc, nil
}

// release returns a pool's connection, if the call took one. pgxpool
// closes a connection that is still in a transaction instead of keeping it.
func (a *acquirer) release(pc *pgxpool.Conn) {
	if pc != nil {
		pc.Release()
	}
}

// rollback ends the transaction a failed attempt left on c (an aborted
// one when BEGIN came first), under a context of its own (see
// rollbackTimeout). On failure it closes the connection.
func (a *acquirer) rollback(ctx context.Context, c *pgx.Conn) {
	if c.IsClosed() || c.PgConn().TxStatus() == 'I' {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if _, err := c.Exec(rctx, "ROLLBACK"); err != nil {
		_ = c.Close(rctx)
	}
}

// end rolls tx back under a context of its own, which a cancelled ctx does
// not end at once: see rollbackTimeout.
func end(ctx context.Context, tx pgx.Tx) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	return tx.Rollback(rctx)
}

// Pool implements driver.Acquirer: callers on one pool queue behind each
// other, and each takes a connection of its own, so that the next caller
// of a local queue can begin while this call's lock ends.
func (a *acquirer) Pool() driver.PoolKey {
	if a.pool == nil {
		return driver.PoolKey{}
	}
	return driver.PoolKeyOf(a.pool)
}

// IdleConn implements driver.Acquirer.
func (a *acquirer) IdleConn() bool { return a.pool != nil && a.pool.Stat().IdleConns() > 0 }

// BeginUnlocked implements driver.Acquirer: the transaction of
// txlock.WithFailOpen, without the lock.
func (a *acquirer) BeginUnlocked(ctx context.Context, begin string) (driver.Tx, error) {
	c, pc, err := a.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("txlock: acquiring a connection: %w", err)
	}
	tx, err := c.BeginTx(ctx, pgx.TxOptions{BeginQuery: begin})
	if err != nil {
		a.release(pc)
		return nil, fmt.Errorf("txlock: begin: %w", err)
	}
	return &heldTx{fn: a.fn, ctx: ctx, pool: a.pool, pc: pc, tx: tx}, nil
}

// heldTx is a transaction that fn runs in (driver.Tx), and the session its
// fencing tokens use (driver.Session).
type heldTx struct {
	fn   func(context.Context, pgx.Tx) error
	ctx  context.Context // the caller's, which rollbacks outlive
	pool *pgxpool.Pool   // for draws, if the call was given a pool
	pc   *pgxpool.Conn   // the pool's connection, to release once tx ends
	tx   pgx.Tx

	ran bool // fn has run in tx

	mu     sync.Mutex // held while a token is confirmed on tx
	closed bool       // fn has returned: tx is not the token's to use
}

var (
	_ driver.TermTx  = (*heldTx)(nil)
	_ driver.Session = (*heldTx)(nil)
)

// Fn implements driver.Tx.
func (h *heldTx) Fn(ctx context.Context) error {
	h.ran = true
	return h.fn(ctx, h.tx)
}

// Commit implements driver.Tx.
func (h *heldTx) Commit(ctx context.Context) error {
	h.close()
	err := h.tx.Commit(ctx)
	switch {
	case errors.Is(err, pgx.ErrTxClosed):
		return driver.ErrFnEndedTx
	case errors.Is(err, pgx.ErrTxCommitRollback):
		return fmt.Errorf("%w: %w", driver.ErrCommitRolledBack, err)
	}
	return err
}

// Rollback implements driver.Tx, under a context of its own: see
// rollbackTimeout.
func (h *heldTx) Rollback() error {
	h.close()
	err := end(h.ctx, h.tx)
	if errors.Is(err, pgx.ErrTxClosed) {
		return driver.ErrFnEndedTx
	}
	return err
}

// Exec implements driver.TermTx. A statement without arguments goes with
// the simple protocol, in every exec mode; when ctx ends first, pgx closes
// the connection.
func (h *heldTx) Exec(ctx context.Context, stmt string) error {
	_, err := h.tx.Exec(ctx, stmt)
	return err
}

// RollbackContext implements driver.TermTx: pgx closes the connection if
// ctx ends before the rollback's answer.
func (h *heldTx) RollbackContext(ctx context.Context) error {
	h.close()
	err := h.tx.Rollback(ctx)
	if errors.Is(err, pgx.ErrTxClosed) {
		return driver.ErrFnEndedTx
	}
	return err
}

// Close implements driver.Tx: it returns the pool's connection, if the call
// took one.
func (h *heldTx) Close() {
	if h.pc != nil {
		h.pc.Release()
	}
}

// close ends the session's use of tx, once a confirmation under way has
// finished, before the commit or rollback: fn has returned (from then on
// the lock loop starts no token), and a token that a goroutine of fn was
// confirming on the connection finishes first.
func (h *heldTx) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
}

// DrawRow runs the draw on another connection of the pool. It is sent with
// the simple protocol, so that it works in every exec mode behind PgBouncer.
func (s *heldTx) DrawRow(ctx context.Context, query string, dest ...any) error {
	if s.pool == nil {
		return fmt.Errorf("%w: fencing tokens are drawn on a second connection, and the lock was given a single connection; give it the *pgxpool.Pool", txlock.ErrNoToken)
	}
	stat := s.pool.Stat()
	switch {
	case stat.MaxConns() == 1:
		return fmt.Errorf("%w: the pool allows one connection (MaxConns 1), which the lock holds; a token needs a second", txlock.ErrNoToken)
	case stat.AcquiredConns() >= stat.MaxConns():
		// Waiting for one could wait for ever, if every holder does.
		return fmt.Errorf("%w: the pool's %d connections are all in use, the lock's among them, and a token is drawn on another; give the call txlock.WithFencing(), which sets a connection aside for draws before the lock is taken, or make the pool larger than the number of holders", txlock.ErrNoToken, stat.MaxConns())
	}
	return s.pool.QueryRow(ctx, query, pgx.QueryExecModeSimpleProtocol).Scan(dest...)
}

// OpenDraw implements driver.Drawer: WithFencing sets a connection of the
// pool aside for draws.
func (a *acquirer) OpenDraw() (func(context.Context) (driver.DrawConn, error), error) {
	if a.pool == nil {
		return nil, fmt.Errorf("%w: WithFencing sets a connection of the pool aside for fencing tokens, and db is a single connection, not a *pgxpool.Pool", txlock.ErrInvalidArgument)
	}
	if a.pool.Config().MaxConns == 1 {
		return nil, fmt.Errorf("%w: WithFencing sets a connection of the pool aside for fencing tokens, and the pool allows one (MaxConns 1), which the lock needs", txlock.ErrInvalidArgument)
	}
	pool := a.pool
	return func(ctx context.Context) (driver.DrawConn, error) {
		pc, err := pool.Acquire(ctx)
		if err != nil {
			return nil, err
		}
		return drawConn{pc}, nil
	}, nil
}

// drawConn is a pool connection set aside for draws (txlock.WithFencing).
type drawConn struct{ pc *pgxpool.Conn }

// DrawRow runs the draw with the simple protocol, as heldTx.DrawRow does.
func (d drawConn) DrawRow(ctx context.Context, query string, dest ...any) error {
	return d.pc.QueryRow(ctx, query, pgx.QueryExecModeSimpleProtocol).Scan(dest...)
}

// Exec runs query with the simple protocol, which pgx uses for a statement
// without arguments in every exec mode.
func (d drawConn) Exec(ctx context.Context, query string) error {
	_, err := d.pc.Exec(ctx, query)
	return err
}

// Close releases the connection; pgxpool closes one that is not idle.
func (d drawConn) Close() { d.pc.Release() }

// LockRow runs query in the lock's transaction, unless fn has returned. A
// pgx connection serves one statement at a time: fn must not run its own
// statements on tx while another goroutine draws a token.
func (s *heldTx) LockRow(ctx context.Context, query string, dest ...any) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%w: fn has returned, and its lock with it", txlock.ErrNoToken)
	}
	return s.tx.QueryRow(ctx, query, pgx.QueryExecModeSimpleProtocol).Scan(dest...)
}
