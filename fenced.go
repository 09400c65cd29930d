package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/txlock/txlock/driver"
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

var errNilQuerier = fmt.Errorf("%w: fenced write: q is nil", ErrInvalidArgument)

// sqlQuerier is a Querier as a driver.Querier.
type sqlQuerier struct{ q Querier }

func (s sqlQuerier) QueryRow(ctx context.Context, query string, args []any, dest ...any) error {
	return s.q.QueryRowContext(ctx, query, args...).Scan(dest...)
}

// On returns ft's writes on q, a connection or transaction of a database
// library other than database/sql, through its driver (package driver):
// pgxlock.QuerierOf adapts pgx's. They are ft's own Update, Delete and
// Upsert, with the same statements, rules and errors.
func (ft FencedTable) On(q driver.Querier) FencedWrites { return FencedWrites{ft: ft, q: q} }

// FencedWrites are a FencedTable's writes on a driver's Querier: see
// FencedTable.On.
type FencedWrites struct {
	ft FencedTable
	q  driver.Querier
}

// Update is FencedTable.Update on the Querier.
func (w FencedWrites) Update(ctx context.Context, token int64, set, where []Col) (int64, error) {
	if isNil(w.q) {
		return 0, errNilQuerier
	}
	return w.ft.update(ctx, w.q, token, set, where)
}

// Delete is FencedTable.Delete on the Querier.
func (w FencedWrites) Delete(ctx context.Context, token int64, where []Col) (int64, error) {
	if isNil(w.q) {
		return 0, errNilQuerier
	}
	return w.ft.delete(ctx, w.q, token, where)
}

// Upsert is FencedTable.Upsert on the Querier.
func (w FencedWrites) Upsert(ctx context.Context, token int64, key, set []Col) error {
	if isNil(w.q) {
		return errNilQuerier
	}
	return w.ft.upsert(ctx, w.q, token, key, set)
}

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
	if isNil(q) {
		return 0, errNilQuerier
	}
	return ft.update(ctx, sqlQuerier{q}, token, set, where)
}

func (ft FencedTable) update(ctx context.Context, q driver.Querier, token int64, set, where []Col) (int64, error) {
	t, err := ft.build(token, set, where, true)
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
	sb.WriteString(t.resultQuery(match))
	return t.exec(ctx, q, sb.String(), args, token)
}

// Delete deletes the rows whose columns equal those of where and whose token
// is at most token. It reports refused and missing rows as Update does.
func (ft FencedTable) Delete(ctx context.Context, q Querier, token int64, where []Col) (int64, error) {
	if isNil(q) {
		return 0, errNilQuerier
	}
	return ft.delete(ctx, sqlQuerier{q}, token, where)
}

func (ft FencedTable) delete(ctx context.Context, q driver.Querier, token int64, where []Col) (int64, error) {
	t, err := ft.build(token, nil, where, false)
	if err != nil {
		return 0, err
	}
	args := []any{token}
	match := t.match(&args, where)
	stmt := "WITH w AS (DELETE FROM " + t.table + " WHERE " + match + " AND (" + t.fence + " IS NULL OR " + t.fence + " OPERATOR(pg_catalog.<=) $1) RETURNING 1)\n" +
		t.resultQuery(match)
	return t.exec(ctx, q, stmt, args, token)
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
	if isNil(q) {
		return errNilQuerier
	}
	return ft.upsert(ctx, sqlQuerier{q}, token, key, set)
}

func (ft FencedTable) upsert(ctx context.Context, q driver.Querier, token int64, key, set []Col) error {
	t, err := ft.build(token, set, key, false)
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
	_, err = t.exec(ctx, q, sb.String(), args, token)
	return err
}

// fencedStmt holds the quoted identifiers of one fenced write.
type fencedStmt struct {
	table, fence string
	set, where   []string
	obs          Observer
}

func (ft FencedTable) build(token int64, set, where []Col, needSet bool) (*fencedStmt, error) {
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

// resultQuery renders the query that follows the write w of Update and Delete:
// the rows written, the rows that match, and the largest token among them.
func (t *fencedStmt) resultQuery(match string) string {
	return "SELECT (SELECT pg_catalog.count(*) FROM w), (SELECT pg_catalog.count(*) FROM " + t.table + " WHERE " + match +
		"), (SELECT pg_catalog.max(" + t.fence + ") FROM " + t.table + " WHERE " + match + ")"
}

// exec executes a fenced write whose statement returns (written, matched,
// max token) and turns that into the result.
func (t *fencedStmt) exec(ctx context.Context, q driver.Querier, stmt string, args []any, token int64) (int64, error) {
	var written, matched int64
	var current sql.NullInt64
	if err := q.QueryRow(ctx, stmt, args, &written, &matched, &current); err != nil {
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
		keys = st.lock.Keys
		if ev.o == nil && st.ev != nil {
			ev.o = st.ev.o
		}
	}
	if ev.on() {
		ev.report(Event{Kind: StaleWrite, Keys: keys, Table: e.Table, Token: e.Token, Current: e.Current, Err: e})
	}
}
