package txlock

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"

	"github.com/txlock/txlock/driver"
)

// DefaultRegistrySchema and DefaultRegistryTable name the table a zero
// Registry keeps keyspace names in.
const (
	DefaultRegistrySchema = "public"
	DefaultRegistryTable  = "txlock_keyspaces"
)

// ErrKeyspaceClash: Registry.Register found the keyspace's namespace owned
// by a keyspace of another name. The error is a *KeyspaceClashError.
var ErrKeyspaceClash = errors.New("txlock: keyspace namespace clash")

// KeyspaceClashError reports two keyspace names whose 32-bit namespaces are
// equal: their keys would lock each other's.
type KeyspaceClashError struct {
	Table     string // the registry table, as quoted in the statement
	Namespace int32  // the namespace both names hash to
	Name      string // the name that was being registered
	Owner     string // the name that owns the namespace in the registry
}

func (e *KeyspaceClashError) Error() string {
	return fmt.Sprintf("txlock: keyspace namespace clash: keyspace %q has namespace %d, which keyspace %q already owns in %s; their keys would lock each other's: rename one of them",
		truncate(e.Name), e.Namespace, truncate(e.Owner), e.Table)
}

// Is reports whether target is ErrKeyspaceClash.
func (e *KeyspaceClashError) Is(target error) bool { return target == ErrKeyspaceClash }

// Registry is a table of keyspace names, one row per namespace, which turns
// a silent collision of two services' namespaces into an error at start-up:
// each service registers its keyspaces, and Register fails if another name
// already owns the namespace. It also lets tools (the txlock command's
// locks) show the keyspace names of the locks they find in pg_locks.
//
// The zero Registry uses public.txlock_keyspaces (DefaultRegistrySchema,
// DefaultRegistryTable). Like the Fencer's sequence, the table is always
// named with its schema, never looked up through the search_path. Create it
// once with Create, or with the migration file
// migrations/0002_txlock_keyspaces.sql, which holds the DDL of the zero
// Registry.
//
// The registry is optional: locking never reads it. Its statements take no
// bind parameters, and run in every pgx exec mode behind PgBouncer (see
// Registry.Register).
type Registry struct {
	Schema string // schema of the table; DefaultRegistrySchema if empty
	Table  string // table name; DefaultRegistryTable if empty
}

// table returns the quoted, schema-qualified table name.
func (r Registry) table() (string, error) {
	schema, name := r.Schema, r.Table
	if schema == "" {
		schema = DefaultRegistrySchema
	}
	if name == "" {
		name = DefaultRegistryTable
	}
	return qualified("Registry", schema, name)
}

// DDL returns the statement that creates the registry table if it does not
// exist, for a migration of your own tool. For the zero Registry it is the
// statement of migrations/0002_txlock_keyspaces.sql.
//
// The CHECK constraint holds every row to NewKeyspace's hash, so the table
// cannot map a namespace to a name that does not produce it. Every
// function, operator and type that is not an SQL keyword is qualified with
// pg_catalog, as in the library's other statements.
func (r Registry) DDL() (string, error) {
	t, err := r.table()
	if err != nil {
		return "", err
	}
	return `CREATE TABLE IF NOT EXISTS ` + t + ` (
    namespace integer PRIMARY KEY,
    name pg_catalog.text NOT NULL,
    registered_at timestamp with time zone NOT NULL DEFAULT pg_catalog.now(),
    last_registered_at timestamp with time zone NOT NULL DEFAULT pg_catalog.now(),
    CONSTRAINT namespace_is_hash_of_name CHECK (namespace OPERATOR(pg_catalog.=) CAST(CAST('x' OPERATOR(pg_catalog.||)
        pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(name, 'UTF8')), 'hex'), 8) AS bit(32)) AS integer))
)`, nil
}

// Create creates the registry table if it does not exist, in its schema
// (DefaultRegistrySchema for the zero Registry), which must exist.
func (r Registry) Create(ctx context.Context, db interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}) error {
	ddl, err := r.DDL()
	if err != nil {
		return err
	}
	if isNil(db) {
		return fmt.Errorf("%w: Registry.Create: db is nil", ErrInvalidArgument)
	}
	if _, err := db.ExecContext(ctx, ddl); err != nil {
		t, _ := r.table()
		return fmt.Errorf("txlock: creating keyspace registry %s: %w", t, err)
	}
	return nil
}

// Register records that ks's namespace belongs to ks's name. Registering a
// name again, from any number of instances at once, succeeds (and updates
// the row's last_registered_at). If another name owns the namespace, the
// error is a *KeyspaceClashError, which matches ErrKeyspaceClash and names
// both keyspaces: call Register at start-up, before taking locks, and stop
// if it fails.
//
// ks must come from NewKeyspace: a keyspace of KeyspaceID has no name to
// register (ErrInvalidArgument), and an invalid one returns its own error
// (ErrInvalidKey).
//
// Its statements take no bind parameters, and run in every pgx exec mode
// behind a transaction-mode pooler, as a token draw does: on a pool or a
// connection (*sql.DB, *sql.Conn), in a transaction of their own; in a
// transaction (*sql.Tx), as statements prepared under names of their own,
// and closed.
func (r Registry) Register(ctx context.Context, db Querier, ks Keyspace) error {
	var q driver.Querier
	if !isNil(db) {
		q = noArgsQuerier{db}
	}
	return r.On(q).Register(ctx, ks)
}

// Keyspaces returns the registered keyspaces, ordered by name, as
// NewKeyspace gives them: ks.Key(name) and ks.ID(n) are the keys the
// services that registered them lock.
func (r Registry) Keyspaces(ctx context.Context, db interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}) ([]Keyspace, error) {
	var q driver.Querier
	if !isNil(db) {
		q = noArgsQuerier{db}
	}
	return r.On(q).Keyspaces(ctx)
}

// On returns r's Register and Keyspaces on q, a connection or transaction
// of a database library other than database/sql, through its driver
// (package driver): pgxlock.QuerierOf adapts pgx's. Create the table with
// the statement DDL returns, run as that library runs one.
func (r Registry) On(q driver.Querier) Registrar { return Registrar{r: r, q: q} }

// A Registrar is a Registry's calls on a driver's Querier: see
// Registry.On.
type Registrar struct {
	r Registry
	q driver.Querier
}

// Register is Registry.Register on the Querier.
func (g Registrar) Register(ctx context.Context, ks Keyspace) error {
	t, err := g.r.table()
	if err != nil {
		return err
	}
	switch {
	case ks.err != nil:
		return fmt.Errorf("txlock: Registry.Register: %w", ks.err)
	case ks.label == "":
		return fmt.Errorf("%w: Registry.Register: keyspace %d has no name (it was made with KeyspaceID); only keyspaces of NewKeyspace can be registered", ErrInvalidArgument, ks.ns)
	case isNil(g.q):
		return fmt.Errorf("%w: Registry.Register: db is nil", ErrInvalidArgument)
	}
	// The update of a row that holds the same name returns it; a row of
	// another name makes ON CONFLICT return nothing, which the count makes
	// one row, whatever a driver does with none. ON CONFLICT waits for a
	// concurrent insert of the same namespace to commit and then sees it,
	// so that many instances starting at once all succeed.
	//
	// The values are literals, not bind parameters: a statement without
	// arguments runs in every exec mode behind a transaction-mode pooler
	// (see Registry.Register).
	var n int
	ns := strconv.Itoa(int(ks.ns))
	err = g.q.QueryRow(ctx, `WITH ins AS (INSERT INTO `+t+` AS t (namespace, name) VALUES (`+ns+`, `+quoteLiteral(ks.label)+`)
		ON CONFLICT (namespace) DO UPDATE SET last_registered_at = pg_catalog.now()
		WHERE t.name OPERATOR(pg_catalog.=) EXCLUDED.name
		RETURNING true)
		SELECT pg_catalog.count(*) FROM ins`, nil, &n)
	if err != nil {
		return registryErr(t, "registering keyspace "+fmt.Sprintf("%q", truncate(ks.label)), err)
	}
	if n == 1 {
		return nil
	}
	// The row of another name was committed before ON CONFLICT returned, so
	// this statement's snapshot sees it.
	var owner string
	err = g.q.QueryRow(ctx, `SELECT name FROM `+t+` WHERE namespace OPERATOR(pg_catalog.=) `+ns, nil, &owner)
	if err != nil {
		return registryErr(t, "reading the owner of namespace "+fmt.Sprint(ks.ns), err)
	}
	return &KeyspaceClashError{Table: t, Namespace: ks.ns, Name: ks.label, Owner: owner}
}

// Keyspaces is Registry.Keyspaces on the Querier. The rows come as one
// JSON array, so that one row carries them through every driver.
func (g Registrar) Keyspaces(ctx context.Context) ([]Keyspace, error) {
	t, err := g.r.table()
	if err != nil {
		return nil, err
	}
	if isNil(g.q) {
		return nil, fmt.Errorf("%w: Registry.Keyspaces: db is nil", ErrInvalidArgument)
	}
	var doc string
	err = g.q.QueryRow(ctx, `SELECT CAST(coalesce(pg_catalog.json_agg(pg_catalog.json_build_array(namespace, name)), '[]') AS pg_catalog.text) FROM `+t, nil, &doc)
	if err != nil {
		return nil, registryErr(t, "reading keyspaces", err)
	}
	var rows [][2]json.RawMessage
	if err := json.Unmarshal([]byte(doc), &rows); err != nil {
		return nil, registryErr(t, "reading keyspaces", err)
	}
	out := make([]Keyspace, 0, len(rows))
	for _, row := range rows {
		var ns int32
		var name string
		if err := errors.Join(json.Unmarshal(row[0], &ns), json.Unmarshal(row[1], &name)); err != nil {
			return nil, registryErr(t, "reading keyspaces", err)
		}
		ks := NewKeyspace(name)
		if ks.err != nil || ks.ns != ns {
			// The table's CHECK rules this out; a table made without it
			// could hold such a row.
			return nil, fmt.Errorf("txlock: keyspace registry %s: row (namespace %d, name %q) does not match NewKeyspace(%q), whose namespace is %d", t, ns, truncate(name), truncate(name), ks.ns)
		}
		out = append(out, ks)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].label < out[j].label })
	return out, nil
}

// noArgsQuerier runs the registry's statements, which take no arguments,
// on a database/sql handle: see Registry.Register.
type noArgsQuerier struct{ db any }

func (q noArgsQuerier) QueryRow(ctx context.Context, query string, _ []any, dest ...any) error {
	switch db := q.db.(type) {
	case rowQuerier:
		return queryRow(ctx, db, db, query, dest...)
	case preparer:
		return preparedRow(ctx, db, query, dest...)
	case Querier:
		return db.QueryRowContext(ctx, query).Scan(dest...)
	case queryContexter:
		return rowsQuerier{db}.QueryRow(ctx, query, nil, dest...)
	}
	return fmt.Errorf("%w: %T cannot run a query", ErrInvalidArgument, q.db)
}

// queryContexter is the database/sql method Registry.Keyspaces needs.
type queryContexter interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// rowsQuerier is a database/sql QueryContext as a driver.Querier.
type rowsQuerier struct{ db queryContexter }

func (q rowsQuerier) QueryRow(ctx context.Context, query string, args []any, dest ...any) error {
	rows, err := q.db.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := rows.Scan(dest...); err != nil {
		return err
	}
	return rows.Close()
}

// registryErr wraps a failed statement on the registry table, with the fix
// when the table does not exist.
func registryErr(table, doing string, err error) error {
	if SQLState(err) == "42P01" { // undefined_table
		return fmt.Errorf("txlock: keyspace registry %s: %s: %w (create the table with Registry.Create or migrations/0002_txlock_keyspaces.sql)", table, doing, err)
	}
	return fmt.Errorf("txlock: keyspace registry %s: %s: %w", table, doing, err)
}
