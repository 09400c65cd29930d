package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
)

// Fencing tokens: the Fencer, the draw of a token on fn's lock, and its
// check on the lock's transaction. draw.go holds where a draw runs.

// Fencer issues fencing tokens from a PostgreSQL sequence. The zero Fencer
// uses public.txlock_fence_seq (DefaultFenceSchema, DefaultFenceSequence).
//
// The sequence is always named with its schema, never looked up through the
// search_path: a sequence of the same name in a schema that a connection's
// search_path lists first must not stand in for it. Set Schema to keep the
// sequence elsewhere, for example in a database without a public schema.
//
// Create the sequence once with CreateSequence, or with the migration file
// migrations/0001_txlock_fence_seq.sql.
type Fencer struct {
	Schema   string // schema of the sequence; DefaultFenceSchema if empty
	Sequence string // sequence name; DefaultFenceSequence if empty
}

// FenceToken returns a fencing token for the lock that ctx's fn holds, from
// the zero Fencer's sequence. See Fencer.Token.
func FenceToken(ctx context.Context) (int64, error) { return Fencer{}.Token(ctx) }

// Token returns a fencing token for the lock held by the fn whose context is
// ctx. Tokens only go up: a holder that acquires a lock after another holder
// released or lost it always gets a larger token, even across a crash of the
// server. The first call draws the token; later calls in the same fn return
// the same one.
//
// How: the token is drawn with nextval on another connection of the pool, in
// a transaction of its own that commits durably: it writes a WAL record of
// its own (pg_logical_emit_message), and synchronous_commit is raised to on
// if it was off or local, so that its commit waits until the WAL, the
// sequence's included, is flushed and, with synchronous replication,
// replicated. (A transaction that wrote no WAL before its commit record
// does not wait at all, and nextval writes WAL only once per 32 values:
// 31 draws in 32 would otherwise commit at once, even on a primary whose
// synchronous standby is gone, and a failover, or a crash before the
// 32nd's commit, would hand those tokens out again:
// TestTokenCommitWaits.) Then the lock's transaction is asked
// one statement, which proves it was alive, and so held the lock, until after
// the draw. A transaction-scoped lock cannot be lost while its transaction
// lives. Cost: with WithFencing, three round trips, two of them on the
// draw connection; without it, on database/sql four, three of them on the
// second connection (the draw runs in a transaction of its own there: see
// draw.go; five where it must be prepared in it), and on pgxlock two, one
// on each.
//
// The db given to WithLock must therefore be a pool (*sql.DB, *sqlx.DB,
// *pgxpool.Pool) of at least two connections: a single connection, or a
// pool limited to one, gets ErrNoToken rather than a deadlock, and so does a
// draw that lands on the lock's own session. Give calls whose fn draws
// tokens WithFencing, which sets the draw's connection aside before the
// lock is taken: holders then never wait for one, however many of them
// the pool's connections serve, or a pooler's server connections (the
// draw connection keeps one: see draw.go). Without it, a draw on a pool whose
// connections are all in use fails at once with ErrNoToken (see draw.go
// for both rules). A token is never issued to a fn that does not hold its
// lock, or after fn has returned (ErrNoToken).
//
// On a term's context (Term.Context, Lead's fn), Token draws nothing: it
// returns the term's token, drawn when the term began, if f's sequence is
// the term's (the zero Fencer's, or WithTermFencer's), and ErrNoToken,
// naming the term's sequence, otherwise.
//
// The draw and its check work in every exec mode of pgx behind PgBouncer
// 1.18 in transaction mode (see draw.go for how). Surviving a failover
// needs synchronous replication; a token drawn from an asynchronous standby
// promoted after a crash can repeat.
func (f Fencer) Token(ctx context.Context) (int64, error) {
	st, ok := stateFrom(ctx)
	switch {
	case !ok:
		return 0, fmt.Errorf("%w: ctx does not come from a WithLock fn", ErrNoToken)
	case !st.lock.Held:
		return 0, fmt.Errorf("%w: fn runs without the lock (fail-open)", ErrNoToken)
	case st.ended.Load():
		return 0, fmt.Errorf("%w: fn has returned, and its lock with it", ErrNoToken)
	}
	if _, ok := st.sess.(noSession); ok {
		return 0, errNoSession
	}
	seq, err := f.sequence()
	if err != nil {
		return 0, err
	}
	if t, ok := st.Context.(ownTerm); ok {
		return t.fenceToken(seq)
	}
	return drawToken(ctx, st, seq)
}

// drawToken draws st's token from seq, once, as Fencer.Token describes; its
// statements run under ctx.
func drawToken(ctx context.Context, st *lockState, seq string) (int64, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if t, ok := st.tokens[seq]; ok {
		return t, nil
	}
	var token int64
	var drawPID int
	// Every name is qualified, the sequence's too, and the comparison is
	// pg_catalog's: no search_path can change what this statement does.
	err := drawRow(ctx, st, `SELECT pg_catalog.nextval(`+quoteLiteral(seq)+`::pg_catalog.regclass),
		pg_catalog.pg_logical_emit_message(true, 'txlock', 'fencing token')::pg_catalog.text, pg_catalog.pg_backend_pid(),
		pg_catalog.set_config('synchronous_commit', CASE
			WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) ANY (ARRAY['off', 'local']) THEN 'on'
			ELSE pg_catalog.current_setting('synchronous_commit') END, true)`, &token, new(string), &drawPID, new(string))
	if errors.Is(err, ErrNoToken) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("txlock: drawing a fencing token from %s: %w", seq, err)
	}
	// The lock's transaction must still be alive: then the lock was held
	// without a break from the grant until after the draw. It must also be
	// another session than the draw's, or the draw ran inside the
	// uncommitted lock transaction (a db that wraps one connection).
	same, err := sameSession(ctx, st, drawPID)
	if err != nil {
		return 0, fmt.Errorf("%w: the lock's transaction ended before the token could be confirmed: %w", ErrNoToken, err)
	}
	if same {
		if st.sess != nil {
			return 0, fmt.Errorf("%w: the token was drawn on the lock's own connection; give the lock a pool", ErrNoToken)
		}
		return 0, fmt.Errorf("%w: the token was drawn on the lock's own connection (%T wraps a single connection?); give WithLock a pool", ErrNoToken, st.db)
	}
	if st.tokens == nil {
		st.tokens = map[string]int64{}
	}
	st.tokens[seq] = token
	if st.ev != nil {
		st.ev.report(Event{Kind: TokenIssued, Keys: st.lock.Keys, Shared: st.lock.Shared, Token: token, Sequence: seq, Slots: st.lock.Slots, Slot: st.lock.Slot})
	}
	return token, nil
}

// drawRow runs a token's draw on another connection than st's lock, and
// scans its row into dest: on the connection WithFencing set aside, if any;
// else on one of the pool's (see draw.go).
func drawRow(ctx context.Context, st *lockState, query string, dest ...any) error {
	if st.draw != nil {
		if drawn, err := st.draw.draw(ctx, query, dest...); drawn {
			return err
		}
	}
	if st.sess != nil {
		return st.sess.DrawRow(ctx, query, dest...)
	}
	q, h, err := tokenPool(st.db)
	if err != nil {
		return err
	}
	return queryRow(ctx, h, q, query, dest...)
}

// sameSession asks the lock's transaction whether its backend is drawPID,
// which also proves the transaction alive. On database/sql the question is
// a statement whose row count is the answer, which the drivers send
// without preparing it (pgx: with the simple protocol) in every exec mode.
func sameSession(ctx context.Context, st *lockState, drawPID int) (bool, error) {
	if st.sess != nil {
		var lockPID int
		if err := st.sess.LockRow(ctx, "SELECT pg_catalog.pg_backend_pid()", &lockPID); err != nil {
			return false, err
		}
		return lockPID == drawPID, nil
	}
	res, err := st.tx.ExecContext(ctx, "SELECT 1 WHERE pg_catalog.pg_backend_pid() OPERATOR(pg_catalog.=) "+strconv.Itoa(drawPID))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// CreateSequence creates the Fencer's sequence if it does not exist, in its
// schema (DefaultFenceSchema for the zero Fencer), which must exist. The
// sequence is a bigint with CACHE 1 (a per-session cache would hand out
// numbers out of order) and NO CYCLE. An existing sequence with a larger
// CACHE is reported as an error matching ErrInvalidArgument.
func (f Fencer) CreateSequence(ctx context.Context, db interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}) error {
	seq, err := f.sequence()
	if err != nil {
		return err
	}
	if isNil(db) {
		return fmt.Errorf("%w: db is nil", ErrInvalidArgument)
	}
	// One statement: behind PgBouncer the two parts must not land on
	// different server connections. A sequence that already existed with a
	// per-session cache would hand out tokens out of order: refuse it.
	res, err := db.ExecContext(ctx, sequenceDDL(seq)+`;
		SELECT 1 FROM pg_catalog.pg_sequence WHERE seqrelid OPERATOR(pg_catalog.=) `+quoteLiteral(seq)+`::pg_catalog.regclass
			AND seqcache OPERATOR(pg_catalog.>) 1`)
	if err != nil {
		return fmt.Errorf("txlock: creating fencing sequence %s: %w", seq, err)
	}
	if n, err := res.RowsAffected(); err == nil && n > 0 {
		return fmt.Errorf("%w: fencing sequence %s exists with a CACHE above 1, which hands out tokens out of order; ALTER SEQUENCE %s CACHE 1", ErrInvalidArgument, seq, seq)
	}
	return nil
}

// DDL returns the statement that creates the Fencer's sequence if it does
// not exist, as CreateSequence does: for a migration, or for a connection
// that is not database/sql's (pgx: pool.Exec(ctx, ddl)). Unlike
// CreateSequence it cannot refuse an existing sequence with a CACHE above
// 1, which hands out tokens out of order.
func (f Fencer) DDL() (string, error) {
	seq, err := f.sequence()
	if err != nil {
		return "", err
	}
	return sequenceDDL(seq), nil
}

// sequenceDDL creates the sequence seq, quoted and qualified: a bigint,
// CACHE 1 (a per-session cache would hand out numbers out of order), NO
// CYCLE.
func sequenceDDL(seq string) string {
	return `CREATE SEQUENCE IF NOT EXISTS ` + seq + ` AS bigint CACHE 1 NO CYCLE`
}

// sequence returns the quoted, schema-qualified sequence name.
func (f Fencer) sequence() (string, error) {
	schema, name := f.Schema, f.Sequence
	if schema == "" {
		schema = DefaultFenceSchema
	}
	if name == "" {
		name = DefaultFenceSequence
	}
	return qualified("Fencer", schema, name)
}

// tokenPool returns where a token is drawn when the call set no connection
// aside (WithFencing): db, if it is a pool with a connection to spare, and
// its queue handle.
func tokenPool(db DB) (rowQuerier, any, error) {
	if _, ok := db.(*sql.Conn); ok {
		return nil, nil, fmt.Errorf("%w: fencing tokens are drawn on a second connection, and WithLock was given a single *sql.Conn; give it the *sql.DB", ErrNoToken)
	}
	h := queueHandle(db)
	if pool, ok := h.(*sql.DB); ok {
		s := pool.Stats()
		if s.MaxOpenConnections == 1 {
			return nil, nil, fmt.Errorf("%w: the pool allows one connection (SetMaxOpenConns(1)), which the lock holds; a token needs a second", ErrNoToken)
		}
		if s.MaxOpenConnections > 0 && s.InUse >= s.MaxOpenConnections {
			return nil, nil, errPoolFull(s.InUse, s.MaxOpenConnections)
		}
		return pool, h, nil
	}
	q, ok := db.(rowQuerier)
	if !ok {
		return nil, nil, fmt.Errorf("%w: fencing tokens need a connection pool such as *sql.DB or *sqlx.DB, and WithLock was given %T", ErrNoToken, db)
	}
	return q, h, nil
}
