package txlock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"strings"
	"sync"
	"time"
)

// This file is where fencing tokens are drawn: on a connection of the lock's
// pool other than the lock's own, in a transaction that commits durably (see
// Fencer.Token). Two things make that hard, and both are settled here:
//
//   - A holder that waits for a pool connection to draw on, while every
//     connection of the pool is held by holders that do the same, waits
//     forever. WithFencing sets one connection of the pool aside for draws
//     before the lock is taken, when waiting for it holds nothing: the
//     draw connection, shared by every call of the process on that pool. A
//     draw without it, on a pool whose connections are all in use, fails
//     at once (ErrNoToken) rather than waiting.
//
//     Behind a transaction-mode pooler the same holds one level down: a
//     client connection set aside has no server connection between its
//     transactions, and the holders keep theirs. So the draw connection
//     keeps its server connection by staying in a transaction while it is
//     set aside (drawPin). Each draw runs in that transaction, and then
//     "COMMIT; BEGIN …" goes as one message, to which the server answers
//     with one ReadyForQuery, in a transaction: PgBouncer never sees the
//     connection idle, and never unlinks it. The pinned transaction has no
//     transaction id and, between statements, no snapshot, so it holds
//     nothing back (TestDrawConnectionKeepsItsServer checks both).
//   - A draw is a query that returns a row, which database/sql drivers may
//     send in several messages (pgx's stdlib: by its exec mode), and which a
//     transaction-mode pooler such as PgBouncer 1.18 may then pass to
//     different server connections. So database/sql draws run in a
//     transaction (the draw connection's, or one of their own: see
//     queryRow); pgxlock's draws are sent with the simple protocol, in one
//     message.

// drawPin begins the transaction in which a draw connection waits and
// draws. Its settings end with it: the server's idle-in-transaction and
// transaction timeouts are off for it (a pinned connection is idle in a
// transaction by design, and holds nothing while it is), and
// application_name says what it is, to an operator who sees it in
// pg_stat_activity. transaction_timeout exists from PostgreSQL 17 on.
const drawPin = `BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT pg_catalog.set_config('idle_in_transaction_session_timeout', '0', true),
	CASE WHEN pg_catalog.current_setting('transaction_timeout', true) IS NOT NULL
		THEN pg_catalog.set_config('transaction_timeout', '0', true) END,
	pg_catalog.set_config('application_name', 'txlock fencing-token draws', true)`

// A drawConn is a connection set aside for draws.
type drawConn interface {
	// drawRow runs query, a draw, and scans its one row into dest.
	drawRow(ctx context.Context, query string, dest ...any) error
	// exec runs query, statements without arguments, as one message.
	exec(ctx context.Context, query string) error
	// close gives the connection back to its pool, or closes it if discard
	// (its state is not known to be idle).
	close(discard bool)
}

// A drawer is a pool's draw connection, shared by the calls of this process
// that set it aside (WithFencing).
//
// Nothing waits for a connection of the pool while it holds the drawer: a
// call sets the connection aside (opens it) before it takes its lock, and a
// draw that finds none open (a draw on it failed, and closed it) does not
// wait for one, but draws as a call without WithFencing does.
type drawer struct {
	handle any // the pool, as queueHandle names it
	refs   int // calls that hold the reservation; guarded by drawers

	mu      sync.Mutex    // guards conn and opening; never held across I/O
	conn    drawConn      // nil until opened, and after a draw on it failed
	opening chan struct{} // closed when the opening under way ends; nil when none is
	use     chan struct{} // holds one token while a draw uses conn
}

// drawers are the pools' drawers, while some call holds a reservation.
var drawers = struct {
	sync.Mutex
	m map[any]*drawer
}{m: map[any]*drawer{}}

// drawTimeout bounds one draw on a drawer's connection. The draw runs
// detached from its caller's cancellation, so that a holder that gives up
// (its fn's context ends) does not break the connection every holder shares
// (a driver closes a connection whose statement a context cuts off); a
// draw that takes longer than this (a synchronous commit whose standby is
// gone) is cut off, and the connection with it.
const drawTimeout = 10 * time.Second

// reserveDraw sets aside a connection of the pool handle for draws, opening
// it with open unless one is set aside already, and returns the drawer;
// release it once the call has ended. open waits for a connection of the
// pool as long as ctx allows: call it before the call takes its lock.
func reserveDraw(ctx context.Context, handle any, open func(context.Context) (drawConn, error)) (*drawer, error) {
	drawers.Lock()
	d := drawers.m[handle]
	if d == nil {
		d = &drawer{handle: handle, use: make(chan struct{}, 1)}
		drawers.m[handle] = d
	}
	d.refs++
	drawers.Unlock()
	for {
		d.mu.Lock()
		if d.conn != nil {
			d.mu.Unlock()
			return d, nil
		}
		if ch := d.opening; ch != nil {
			// Another call is opening it: wait for that.
			d.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				d.release()
				return nil, fmt.Errorf("txlock: setting a connection aside for fencing tokens (WithFencing): %w", context.Cause(ctx))
			}
		}
		ch := make(chan struct{})
		d.opening = ch
		d.mu.Unlock()
		c, err := openPinned(ctx, open)
		d.mu.Lock()
		d.opening = nil
		if err == nil {
			d.conn = c
		}
		d.mu.Unlock()
		close(ch)
		if err != nil {
			d.release()
			return nil, fmt.Errorf("txlock: setting a connection aside for fencing tokens (WithFencing): %w", err)
		}
		return d, nil
	}
}

// release ends one call's reservation; the last one gives the connection
// back to its pool, once a draw still using it (a goroutine of a fn that
// has returned) has ended.
func (d *drawer) release() {
	drawers.Lock()
	d.refs--
	last := d.refs == 0
	if last {
		delete(drawers.m, d.handle)
	}
	drawers.Unlock()
	if !last {
		return
	}
	select {
	case d.use <- struct{}{}:
		d.close()
	default:
		// A draw that its caller gave up on still runs (up to
		// drawTimeout): the connection is closed once it ends, and the
		// call returns now, within its bounds.
		go func() {
			d.use <- struct{}{}
			d.close()
		}()
	}
}

// close ends the drawer's connection, with d.use taken.
func (d *drawer) close() {
	d.mu.Lock()
	c := d.conn
	d.conn = nil
	d.mu.Unlock()
	if c != nil {
		unpin(c)
	}
	<-d.use
}

// openPinned opens a draw connection with open, and begins its pinned
// transaction (drawPin).
func openPinned(ctx context.Context, open func(context.Context) (drawConn, error)) (drawConn, error) {
	c, err := open(ctx)
	if err != nil {
		return nil, err
	}
	if err := c.exec(ctx, drawPin); err != nil {
		c.close(true)
		return nil, err
	}
	return c, nil
}

// unpin ends c's pinned transaction and gives c back to its pool.
func unpin(c drawConn) {
	ctx, cancel := context.WithTimeout(context.Background(), drawTimeout)
	err := c.exec(ctx, "ROLLBACK")
	cancel()
	c.close(err != nil)
}

// drawPinned runs a draw on c, in its pinned transaction, then commits it
// and begins the next in one message (see the top of this file). It
// reports broken when c is not to be used again: the connection broke, or
// its transaction could not be ended and begun again. A token is returned
// only once its commit has succeeded.
func drawPinned(ctx context.Context, c drawConn, query string, dest ...any) (err error, broken bool) {
	if err := c.drawRow(ctx, query, dest...); err != nil {
		// The server's answer (a missing sequence, say) leaves the
		// transaction failed: roll it back and begin again.
		return err, connBroken(err) || c.exec(ctx, "ROLLBACK;\n"+drawPin) != nil
	}
	if err := c.exec(ctx, "COMMIT;\n"+drawPin); err != nil {
		return fmt.Errorf("committing the draw: %w", err), true
	}
	return nil, false
}

// draw runs a draw on the drawer's connection, one at a time. It reports
// false when there is none open: the caller then draws as a call without
// WithFencing does. ctx bounds the wait for the connection and for the
// draw's answer; the draw itself is bounded by drawTimeout (see there).
func (d *drawer) draw(ctx context.Context, query string, dest ...any) (bool, error) {
	select {
	case d.use <- struct{}{}:
	case <-ctx.Done():
		return true, fmt.Errorf("waiting for the connection set aside for draws: %w", context.Cause(ctx))
	}
	d.mu.Lock()
	c := d.conn
	d.mu.Unlock()
	if c == nil {
		<-d.use
		return false, nil
	}
	done := make(chan error, 1)
	go func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drawTimeout)
		err, broken := drawPinned(dctx, c, query, dest...)
		cancel()
		if broken {
			// The next call that reserves opens another.
			d.mu.Lock()
			if d.conn == c {
				d.conn = nil
			}
			d.mu.Unlock()
			c.close(true)
		}
		<-d.use
		done <- err
	}()
	select {
	case err := <-done:
		return true, err
	case <-ctx.Done():
		// The draw goes on, and its result is dropped; the connection
		// stays usable.
		return true, context.Cause(ctx)
	}
}

// connBroken reports an error after which a connection is not to be used
// again: one the server did not send (a broken connection, a statement cut
// off by its context), a connection exception (class 08), or the server
// ending the session (57P01, 57P02, 57P03).
func connBroken(err error) bool {
	if err == nil {
		return false
	}
	switch state := SQLState(err); {
	case state == "":
		return true
	case strings.HasPrefix(state, "08"), state == "57P01", state == "57P02", state == "57P03":
		return true
	}
	return false
}

// sqlDrawConn is database/sql's draw connection, of the pool db. Its draws
// run in its pinned transaction, so every message of a draw reaches its one
// server connection behind a transaction-mode pooler. tag, a comment of
// random bytes, ends each draw's text: pgx's cache_statement mode names the
// statement it prepares after the text, and another client may have left a
// statement of that name on the server connection.
type sqlDrawConn struct {
	c   *sql.Conn
	tag string
}

func openSQLDraw(db *sql.DB) func(context.Context) (drawConn, error) {
	return func(ctx context.Context) (drawConn, error) {
		c, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		return sqlDrawConn{c: c, tag: nonceComment()}, nil
	}
}

func (s sqlDrawConn) drawRow(ctx context.Context, query string, dest ...any) error {
	return s.c.QueryRowContext(ctx, query+s.tag).Scan(dest...)
}

// exec runs query with ExecContext and no arguments, which the drivers send
// as a simple query, one message (pgx: in every exec mode).
func (s sqlDrawConn) exec(ctx context.Context, query string) error {
	_, err := s.c.ExecContext(ctx, query)
	return err
}

func (s sqlDrawConn) close(discard bool) {
	if discard {
		// database/sql closes a connection whose use reports ErrBadConn.
		_ = s.c.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = s.c.Close()
}

// nonceComment returns an SQL comment of random bytes, which makes a
// statement's text its own.
func nonceComment() string {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	return " /* txlock " + hex.EncodeToString(nonce[:]) + " */"
}

// rowQuerier is where a database/sql draw runs: *sql.DB, *sql.Conn.
type rowQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
	BeginTx(ctx context.Context, opts *sql.TxOptions) (*sql.Tx, error)
}

// preparedOnly records the pools whose draws need the prepared form (see the
// top of this file), by queue handle.
var preparedOnly sync.Map

// queryRow runs query, which takes no arguments, on q and scans its row, in
// a transaction of its own: then every message of the query reaches one
// server connection through a transaction-mode pooler, which is what pgx's
// exec modes other than cache_statement need there. cache_statement's named
// statements can still collide with another client's on that connection:
// then (42P05, 26000: before the statement ran) the query is made again as a
// statement prepared, run and closed in the transaction, and pool, the queue
// handle of q's pool (or nil), is remembered as needing that form.
func queryRow(ctx context.Context, pool any, q rowQuerier, query string, dest ...any) error {
	if pool != nil {
		if _, ok := preparedOnly.Load(pool); ok {
			return queryRowTx(ctx, q, query, true, dest...)
		}
	}
	err := queryRowTx(ctx, q, query, false, dest...)
	if !preparedStatementLost(err) {
		return err
	}
	if pool != nil {
		preparedOnly.Store(pool, true)
	}
	return queryRowTx(ctx, q, query, true, dest...)
}

// preparedStatementLost reports the errors of a query whose prepared
// statement a transaction-mode pooler lost or mixed up, before the server
// ran it: 42P05 (duplicate_prepared_statement) and 26000
// (invalid_sql_statement_name).
func preparedStatementLost(err error) bool {
	switch SQLState(err) {
	case "42P05", "26000":
		return true
	}
	return false
}

// queryRowTx runs query in a transaction of its own on q, and commits. With
// prepared, it runs it as preparedRow does, in that transaction.
func queryRowTx(ctx context.Context, q rowQuerier, query string, prepared bool, dest ...any) error {
	tx, err := q.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if !prepared {
		err = tx.QueryRowContext(ctx, query).Scan(dest...)
	} else {
		err = preparedRow(ctx, tx, query, dest...)
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}

// preparer is where preparedRow runs: a *sql.Tx.
type preparer interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
}

// preparedRow runs query on p as a statement prepared, run and closed, and
// scans its row. Its text ends with a comment of random bytes, so that its
// name (which pgx derives from the text) is not one that another client
// left on the server connection. In a transaction, the three round trips
// meet the same server connection behind a transaction-mode pooler.
func preparedRow(ctx context.Context, p preparer, query string, dest ...any) error {
	stmt, err := p.PrepareContext(ctx, query+nonceComment())
	if err != nil {
		return err
	}
	err = stmt.QueryRowContext(ctx).Scan(dest...)
	if cerr := stmt.Close(); err == nil {
		err = cerr
	}
	return err
}

// errPoolFull explains a draw refused because the pool has no connection
// to spare: inUse of max are taken, the lock's among them.
func errPoolFull(inUse, max int) error {
	return fmt.Errorf("%w: the pool's %d connections are all in use (%d of them), the lock's among them, and a token is drawn on another; give the call txlock.WithFencing(), which sets a connection aside for draws before the lock is taken, or make the pool larger than the number of holders", ErrNoToken, max, inUse)
}

// A drawPooler is a keeper whose db is a pool that a WithFencing call
// can set a draw connection aside in: it returns the pool's queue handle and
// how to open the connection, or an error matching ErrInvalidArgument.
type drawPooler interface {
	drawPool() (handle any, open func(context.Context) (drawConn, error), err error)
}

// reserveFor sets a draw connection aside for a WithFencing call for keys
// with keeper a, before its lock wait, and returns it with how long that
// took. The reservation is part of the wait: it counts against WithTimeout
// (each round's wait has what is left, see waiter.startWait), and when it
// cannot finish in time the call ends as a wait does (LockTimeoutError or
// CanceledError, with no attempt, and the events WaitStarted and TimedOut
// or Canceled).
func reserveFor(ctx context.Context, c *config, ev *events, keys []Key, a any) (*drawer, time.Duration, error) {
	p, ok := a.(drawPooler)
	if !ok {
		return nil, 0, fmt.Errorf("%w: WithFencing is not supported by this call", ErrInvalidArgument)
	}
	h, open, err := p.drawPool()
	if err != nil {
		return nil, 0, err
	}
	start := c.clock.now()
	rctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	d, err := reserveDraw(rctx, h, open)
	waited := c.clock.now().Sub(start)
	if err != nil {
		if rctx.Err() == nil {
			return nil, 0, err
		}
		kind, werr := waitEnded(ctx, keys, c.slots, 0, waited)
		werr = fmt.Errorf("%w (%v)", werr, err)
		if ev != nil {
			ev.emit(Event{Kind: WaitStarted, Keys: keys, Shared: c.shared})
			ev.emit(Event{Kind: kind, Keys: keys, Shared: c.shared, Waited: waited, Err: werr})
		}
		return nil, 0, werr
	}
	return d, waited, nil
}

// drawPool implements drawPooler for database/sql.
func (a *ownTx) drawPool() (any, func(context.Context) (drawConn, error), error) {
	db, ok := queueHandle(a.db).(*sql.DB)
	if !ok {
		return nil, nil, fmt.Errorf("%w: WithFencing sets a connection of the pool aside for fencing tokens, and db is a %T, not a pool (*sql.DB, *sqlx.DB)", ErrInvalidArgument, a.db)
	}
	if db.Stats().MaxOpenConnections == 1 {
		return nil, nil, fmt.Errorf("%w: WithFencing sets a connection of the pool aside for fencing tokens, and the pool allows one (SetMaxOpenConns(1)), which the lock needs", ErrInvalidArgument)
	}
	return db, openSQLDraw(db), nil
}
