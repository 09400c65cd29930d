package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DefaultFenceSchema and DefaultFenceSequence name the sequence a zero
// Fencer draws tokens from, and DefaultFenceColumn the column a FencedTable
// keeps them in by default.
const (
	DefaultFenceSchema   = "public"
	DefaultFenceSequence = "txlock_fence_seq"
	DefaultFenceColumn   = "fence_token"
)

// Errors of fencing tokens and fenced writes. Match them with errors.Is.
var (
	// ErrStaleToken: a fenced write carried a token smaller than the one the
	// row holds, and was refused. The error is a *StaleTokenError.
	ErrStaleToken = errors.New("txlock: stale fencing token")

	// ErrRowNotFound: a fenced update or delete matched no row.
	ErrRowNotFound = errors.New("txlock: no row matches")

	// ErrNoToken: no fencing token could be issued, because the caller does
	// not hold the lock (outside fn, fn run by WithFailOpen, or the lock's
	// transaction is no longer alive), because the database cannot draw
	// one on a connection of its own, or, on a term's context, because the
	// Fencer's sequence is not the term's.
	ErrNoToken = errors.New("txlock: no fencing token")
)

// StaleTokenError reports a fenced write refused because the row holds a
// larger token: another holder has written since this one's lock was lost.
type StaleTokenError struct {
	Table   string // the table, as quoted in the statement
	Token   int64  // the token the write carried
	Current int64  // the token the row holds; 0 if a concurrent write holds it and it could not be read
}

func (e *StaleTokenError) Error() string {
	if e.Current == 0 {
		return fmt.Sprintf("txlock: stale fencing token: %s was written concurrently with a larger token than %d", e.Table, e.Token)
	}
	return fmt.Sprintf("txlock: stale fencing token: %s holds token %d, the write carried %d", e.Table, e.Current, e.Token)
}

// Is reports whether target is ErrStaleToken.
func (e *StaleTokenError) Is(target error) bool { return target == ErrStaleToken }

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
// a transaction of its own that commits durably (it is given a transaction
// id and synchronous_commit is raised to on if it was off or local, so the
// commit flushes the sequence's WAL). Then the lock's transaction is asked
// one statement, which proves it was alive, and so held the lock, until after
// the draw. A transaction-scoped lock cannot be lost while its transaction
// lives. Cost, on database/sql: four round trips, three of them on the
// second connection (the draw runs in a transaction of its own there: see
// draw.go); on pgxlock: two, one on each.
//
// The db given to WithLock must therefore be a pool (*sql.DB, *sqlx.DB,
// *pgxpool.Pool) of at least two connections: a single connection, or a
// pool limited to one, gets ErrNoToken rather than a deadlock, and so does a
// draw that lands on the lock's own session. Give calls whose fn draws
// tokens WithFencing, which sets the draw's connection aside before the
// lock is taken: holders then never wait for one, however many of them
// the pool's connections serve. Without it, a draw on a pool whose
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
	case !st.lease.Held:
		return 0, fmt.Errorf("%w: fn runs without the lock (fail-open)", ErrNoToken)
	case st.ended.Load():
		return 0, fmt.Errorf("%w: fn has returned, and its lock with it", ErrNoToken)
	}
	seq, err := f.sequence()
	if err != nil {
		return 0, err
	}
	if t := termOf(st); t != nil {
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
	var xid string
	var drawPID int
	// Every name is qualified, the sequence's too, and the comparison is
	// pg_catalog's: no search_path can change what this statement does.
	err := drawRow(ctx, st, `SELECT pg_catalog.nextval(`+quoteLiteral(seq)+`::pg_catalog.regclass),
		pg_catalog.pg_current_xact_id()::pg_catalog.text, pg_catalog.pg_backend_pid(),
		pg_catalog.set_config('synchronous_commit', CASE
			WHEN pg_catalog.current_setting('synchronous_commit') OPERATOR(pg_catalog.=) ANY (ARRAY['off', 'local']) THEN 'on'
			ELSE pg_catalog.current_setting('synchronous_commit') END, true)`, &token, &xid, &drawPID, new(string))
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
		st.ev.report(Event{Kind: TokenIssued, Keys: st.lease.Keys, Shared: st.lease.Shared, Token: token, Sequence: seq})
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
	res, err := db.ExecContext(ctx, `CREATE SEQUENCE IF NOT EXISTS `+seq+` AS bigint CACHE 1 NO CYCLE;
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
func tokenPool(db Beginner) (rowQuerier, any, error) {
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

// Querier runs a statement and returns one row: *sql.DB, *sql.Tx, *sql.Conn,
// *sqlx.DB and *sqlx.Tx all satisfy it.
type Querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

var (
	_ Querier = (*sql.DB)(nil)
	_ Querier = (*sql.Tx)(nil)
	_ Querier = (*sql.Conn)(nil)
)

// Col is a column name and a value for it. Values are always sent as bind
// parameters; names are quoted as identifiers.
type Col struct {
	Name  string
	Value any
}

// FencedTable describes a table whose rows carry the fencing token of their
// last writer, in a bigint column:
//
//	ALTER TABLE stock ADD COLUMN fence_token bigint NOT NULL DEFAULT 0;
//
// Its methods write a row only if the row's token is not larger than the
// writer's, and report a refused write as a *StaleTokenError. A NULL token
// counts as never fenced. Each runs one statement, in one round trip, on any
// Querier: a fenced write usually runs outside the lock's transaction, often
// against another database. The zero FenceColumn means DefaultFenceColumn.
type FencedTable struct {
	Schema      string // optional; without it, the table is found through the search_path, as in the caller's own queries
	Name        string // required
	FenceColumn string // DefaultFenceColumn if empty
	// Observer, if not nil, is told of every refused write (StaleWrite).
	// Without it, a write whose ctx is a WithLock fn's reports to that
	// call's Observer.
	Observer Observer
}

// Update sets the columns of set, and the fence column to token, in the rows
// whose columns equal those of where and whose token is at most token (so a
// holder may write more than once with its own token). It returns the number
// of rows written. If none was written, the error is a *StaleTokenError when
// matching rows hold a larger token, and ErrRowNotFound when no row matches.
func (ft FencedTable) Update(ctx context.Context, q Querier, token int64, set, where []Col) (int64, error) {
	t, err := ft.prepare(q, token, set, where, true)
	if err != nil {
		return 0, err
	}
	var sb strings.Builder
	args := make([]any, 0, len(set)+len(where)+1)
	sb.WriteString("WITH w AS (UPDATE " + t.table + " SET ")
	for i, c := range set {
		args = append(args, c.Value)
		sb.WriteString(t.set[i] + " = $" + strconv.Itoa(len(args)) + ", ")
	}
	args = append(args, token)
	tok := "$" + strconv.Itoa(len(args))
	sb.WriteString(t.fence + " = " + tok + " WHERE ")
	match := t.match(&args, where)
	sb.WriteString(match + " AND (" + t.fence + " IS NULL OR " + t.fence + " OPERATOR(pg_catalog.<=) " + tok + ") RETURNING 1)\n")
	sb.WriteString(t.outcome(match))
	return t.run(ctx, q, sb.String(), args, token)
}

// Delete deletes the rows whose columns equal those of where and whose token
// is at most token. It reports refused and missing rows as Update does.
func (ft FencedTable) Delete(ctx context.Context, q Querier, token int64, where []Col) (int64, error) {
	t, err := ft.prepare(q, token, nil, where, false)
	if err != nil {
		return 0, err
	}
	args := []any{token}
	match := t.match(&args, where)
	stmt := "WITH w AS (DELETE FROM " + t.table + " WHERE " + match + " AND (" + t.fence + " IS NULL OR " + t.fence + " OPERATOR(pg_catalog.<=) $1) RETURNING 1)\n" +
		t.outcome(match)
	return t.run(ctx, q, stmt, args, token)
}

// Upsert inserts a row with the columns of key and set and the fence column
// set to token, or, if a row with the same key exists (key's columns must
// have a unique index), updates its set columns and token, unless it holds a
// larger token: then the error is a *StaleTokenError.
//
//	INSERT INTO t AS t (key…, set…, fence_token) VALUES (…)
//	ON CONFLICT (key…) DO UPDATE SET set… = EXCLUDED.…, fence_token = EXCLUDED.fence_token
//	WHERE t.fence_token IS NULL OR t.fence_token OPERATOR(pg_catalog.<=) EXCLUDED.fence_token
func (ft FencedTable) Upsert(ctx context.Context, q Querier, token int64, key, set []Col) error {
	t, err := ft.prepare(q, token, set, key, false)
	if err != nil {
		return err
	}
	cols := append(append([]string{}, t.where...), t.set...)
	var args []any
	var vals []string
	for _, c := range append(append([]Col{}, key...), set...) {
		args = append(args, c.Value)
		vals = append(vals, "$"+strconv.Itoa(len(args)))
	}
	args = append(args, token)
	vals = append(vals, "$"+strconv.Itoa(len(args)))
	var sb strings.Builder
	sb.WriteString("WITH w AS (INSERT INTO " + t.table + " AS t (" + strings.Join(cols, ", ") + ", " + t.fence + ") VALUES (" + strings.Join(vals, ", ") + ")")
	sb.WriteString(" ON CONFLICT (" + strings.Join(t.where, ", ") + ") DO UPDATE SET ")
	for _, c := range t.set {
		sb.WriteString(c + " = EXCLUDED." + c + ", ")
	}
	sb.WriteString(t.fence + " = EXCLUDED." + t.fence + " WHERE t." + t.fence + " IS NULL OR t." + t.fence + " OPERATOR(pg_catalog.<=) EXCLUDED." + t.fence + " RETURNING 1)\n")
	var match []string
	for i, c := range t.where {
		match = append(match, c+" = $"+strconv.Itoa(i+1))
	}
	m := strings.Join(match, " AND ")
	sb.WriteString("SELECT (SELECT pg_catalog.count(*) FROM w), 1, (SELECT pg_catalog.max(" + t.fence + ") FROM " + t.table + " WHERE " + m + ")")
	_, err = t.run(ctx, q, sb.String(), args, token)
	return err
}

// fencedStmt holds the quoted identifiers of one fenced write.
type fencedStmt struct {
	table, fence string
	set, where   []string
	obs          Observer
}

func (ft FencedTable) prepare(q Querier, token int64, set, where []Col, needSet bool) (*fencedStmt, error) {
	if isNil(q) {
		return nil, fmt.Errorf("%w: fenced write: q is nil", ErrInvalidArgument)
	}
	if token <= 0 {
		return nil, fmt.Errorf("%w: fenced write: token must be positive, got %d", ErrInvalidArgument, token)
	}
	table, err := qualified("FencedTable", ft.Schema, ft.Name)
	if err != nil {
		return nil, err
	}
	fenceName := ft.FenceColumn
	if fenceName == "" {
		fenceName = DefaultFenceColumn
	}
	fence, err := quoteIdent("FencedTable.FenceColumn", fenceName)
	if err != nil {
		return nil, err
	}
	if needSet && len(set) == 0 {
		return nil, fmt.Errorf("%w: fenced write on %s: no columns to set", ErrInvalidArgument, table)
	}
	if len(where) == 0 {
		return nil, fmt.Errorf("%w: fenced write on %s: no columns to match rows by (it would touch every row)", ErrInvalidArgument, table)
	}
	t := &fencedStmt{table: table, fence: fence, obs: ft.Observer}
	seen := map[string]string{fenceName: "is the fence column, which the write sets itself"}
	for _, group := range []struct {
		cols []Col
		out  *[]string
		what string
	}{{set, &t.set, "set"}, {where, &t.where, "match"}} {
		for _, c := range group.cols {
			if why, dup := seen[c.Name]; dup {
				return nil, fmt.Errorf("%w: fenced write on %s: column %q %s", ErrInvalidArgument, table, c.Name, why)
			}
			seen[c.Name] = "appears twice"
			qc, err := quoteIdent(group.what+" column", c.Name)
			if err != nil {
				return nil, err
			}
			*group.out = append(*group.out, qc)
		}
	}
	return t, nil
}

// match renders "col = $n AND …", appending the values to args.
//
// Unlike the rest of the statement, = stays a plain operator, resolved
// through the search_path: the columns and values are the caller's, of the
// caller's types, whose = need not be in pg_catalog. citext's lives in the
// schema the extension was installed in, and OPERATOR(pg_catalog.=) would
// silently compare a citext column as case-sensitive text. The fence
// column's comparison is the library's own, on a bigint, and is qualified.
func (t *fencedStmt) match(args *[]any, where []Col) string {
	parts := make([]string, len(where))
	for i, c := range where {
		*args = append(*args, c.Value)
		parts[i] = t.where[i] + " = $" + strconv.Itoa(len(*args))
	}
	return strings.Join(parts, " AND ")
}

// outcome renders the query that follows the write w of Update and Delete:
// the rows written, the rows that match, and the largest token among them.
func (t *fencedStmt) outcome(match string) string {
	return "SELECT (SELECT pg_catalog.count(*) FROM w), (SELECT pg_catalog.count(*) FROM " + t.table + " WHERE " + match +
		"), (SELECT pg_catalog.max(" + t.fence + ") FROM " + t.table + " WHERE " + match + ")"
}

// run executes a fenced write whose statement returns (written, matched,
// max token) and turns that into the result.
func (t *fencedStmt) run(ctx context.Context, q Querier, stmt string, args []any, token int64) (int64, error) {
	var written, matched int64
	var current sql.NullInt64
	if err := q.QueryRowContext(ctx, stmt, args...).Scan(&written, &matched, &current); err != nil {
		return 0, fmt.Errorf("txlock: fenced write on %s: %w", t.table, err)
	}
	switch {
	case written > 0:
		return written, nil
	case matched == 0:
		return 0, fmt.Errorf("%w: fenced write on %s", ErrRowNotFound, t.table)
	}
	e := &StaleTokenError{Table: t.table, Token: token, Current: current.Int64}
	if e.Current <= token {
		// The snapshot shows an older row: a concurrent writer with a
		// larger token got there first.
		e.Current = 0
	}
	t.reportStale(ctx, e)
	return 0, e
}

// reportStale tells the table's Observer, or that of the WithLock call
// whose fn ctx is, of a refused write.
func (t *fencedStmt) reportStale(ctx context.Context, e *StaleTokenError) {
	ev := events{o: t.obs, ctx: ctx}
	var keys []Key
	if st, ok := stateFrom(ctx); ok {
		keys = st.lease.Keys
		if ev.o == nil && st.ev != nil {
			ev.o = st.ev.o
		}
	}
	if ev.on() {
		ev.report(Event{Kind: StaleWrite, Keys: keys, Table: e.Table, Token: e.Token, Current: e.Current, Err: e})
	}
}

// quoteIdent quotes name as a PostgreSQL identifier. It refuses names that
// are empty, not UTF-8, hold a NUL byte, or exceed PostgreSQL's 63 bytes
// (which the server would silently truncate to another name).
func quoteIdent(what, name string) (string, error) {
	if err := checkName(ErrInvalidArgument, what+" name", name); err != nil {
		return "", err
	}
	if len(name) > 63 {
		return "", fmt.Errorf("%w: %s name %q is longer than PostgreSQL's 63 bytes", ErrInvalidArgument, what, truncate(name))
	}
	return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`, nil
}

// qualified quotes name, and schema if there is one, as "schema"."name".
func qualified(what, schema, name string) (string, error) {
	n, err := quoteIdent(what, name)
	if err != nil {
		return "", err
	}
	if schema == "" {
		return n, nil
	}
	s, err := quoteIdent(what+" schema", schema)
	if err != nil {
		return "", err
	}
	return s + "." + n, nil
}

// quoteLiteral quotes s as an escape string literal (E'…'), which reads the
// same whatever standard_conforming_strings says.
func quoteLiteral(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, "'", "''").Replace(s) + "'"
}
