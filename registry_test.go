package txlock_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// registryIn returns a Registry in a schema of its own, created on db with
// its table, and dropped when the test ends.
func registryIn(t *testing.T, db *sql.DB) txlock.Registry {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	schema := "registry_" + hex.EncodeToString(b[:])
	_, err := db.Exec(`CREATE SCHEMA ` + schema)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		assert.NoError(t, err)
	})
	r := txlock.Registry{Schema: schema}
	require.NoError(t, r.Create(context.Background(), db))
	require.NoError(t, r.Create(context.Background(), db), "Create is idempotent")
	return r
}

// clashingNames returns two keyspace names whose namespaces are equal.
var clashingNames = locktest.ClashingNames

func TestRegistryRegisterAndList(t *testing.T) {
	ctx := context.Background()
	db := direct(t)
	r := registryIn(t, db)

	ks, err := r.Keyspaces(ctx, db)
	require.NoError(t, err)
	assert.Empty(t, ks)

	for _, name := range []string{"orders", "billing", "billing", "émission/ü"} {
		require.NoError(t, r.Register(ctx, db, txlock.NewKeyspace(name)), name)
	}
	ks, err = r.Keyspaces(ctx, db)
	require.NoError(t, err)
	var names []string
	for _, k := range ks {
		names = append(names, k.String())
		assert.Equal(t, txlock.NewKeyspace(k.String()).Namespace(), k.Namespace())
	}
	assert.Equal(t, []string{"billing", "orders", "émission/ü"}, names, "one row per name, ordered by name")

	// The server computed the same namespace as Go: its CHECK accepted
	// every row above, and refuses a row that does not hold the hash.
	_, err = db.Exec(`INSERT INTO `+r.Schema+`.txlock_keyspaces (namespace, name) VALUES ($1, 'orders-bis')`,
		txlock.NewKeyspace("orders").Namespace())
	require.Error(t, err)
	assert.Equal(t, "23514", txlock.SQLState(err), "check_violation: %v", err)

	// A second registration moves last_registered_at, not registered_at.
	var first, last1, first2, last2 time.Time
	read := func(first, last *time.Time) {
		require.NoError(t, db.QueryRow(`SELECT registered_at, last_registered_at FROM `+r.Schema+`.txlock_keyspaces WHERE name = 'orders'`).Scan(first, last))
	}
	read(&first, &last1)
	require.NoError(t, r.Register(ctx, db, txlock.NewKeyspace("orders")))
	read(&first2, &last2)
	assert.True(t, last2.After(last1), "%v, then %v", last1, last2)
	assert.True(t, first2.Equal(first), "%v, then %v", first, first2)
}

func TestRegistryClash(t *testing.T) {
	ctx := context.Background()
	db := direct(t)
	r := registryIn(t, db)
	a, b := clashingNames(t)
	require.Equal(t, txlock.NewKeyspace(a).Namespace(), txlock.NewKeyspace(b).Namespace())

	require.NoError(t, r.Register(ctx, db, txlock.NewKeyspace(a)))
	err := r.Register(ctx, db, txlock.NewKeyspace(b))
	require.ErrorIs(t, err, txlock.ErrKeyspaceClash)
	var clash *txlock.KeyspaceClashError
	require.ErrorAs(t, err, &clash)
	assert.Equal(t, b, clash.Name)
	assert.Equal(t, a, clash.Owner)
	assert.Equal(t, txlock.NewKeyspace(a).Namespace(), clash.Namespace)
	assert.Contains(t, err.Error(), fmt.Sprintf("%q", a))
	assert.Contains(t, err.Error(), fmt.Sprintf("%q", b))
	assert.Contains(t, err.Error(), r.Schema)
	t.Log(err)

	// The owner keeps registering; the registry still holds only it.
	require.NoError(t, r.Register(ctx, db, txlock.NewKeyspace(a)))
	ks, err := r.Keyspaces(ctx, db)
	require.NoError(t, err)
	require.Len(t, ks, 1)
	assert.Equal(t, a, ks[0].String())
}

// TestRegistryConcurrentRegistration: many instances start at once, half of
// them with one name and half with a name of the same namespace, directly
// and through PgBouncer. One name wins; every instance of it succeeds and
// every instance of the other gets the clash.
func TestRegistryConcurrentRegistration(t *testing.T) {
	a, b := clashingNames(t)
	for _, via := range []string{"direct", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			ctx := context.Background()
			admin := direct(t)
			r := registryIn(t, admin)
			db := admin
			if via == "pgbouncer" {
				db, _ = bouncer(t, "exec")
			}
			const n = 16
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					name := a
					if i%2 == 1 {
						name = b
					}
					<-start
					errs[i] = r.Register(ctx, db, txlock.NewKeyspace(name))
				})
			}
			close(start)
			wg.Wait()
			ks, err := r.Keyspaces(ctx, db)
			require.NoError(t, err)
			require.Len(t, ks, 1)
			winner := ks[0].String()
			for i, err := range errs {
				name := a
				if i%2 == 1 {
					name = b
				}
				if name == winner {
					assert.NoError(t, err, "instance %d (%s)", i, name)
				} else {
					assert.ErrorIs(t, err, txlock.ErrKeyspaceClash, "instance %d (%s)", i, name)
				}
			}
		})
	}
}

func TestRegistryBadInput(t *testing.T) {
	ctx := context.Background()
	db := direct(t)
	r := registryIn(t, db)
	for _, tc := range []struct {
		name string
		err  error
		is   error
		msg  string
	}{
		{"KeyspaceID", r.Register(ctx, db, txlock.KeyspaceID(7)), txlock.ErrInvalidArgument, "keyspace 7 has no name"},
		{"invalid keyspace", r.Register(ctx, db, txlock.NewKeyspace("")), txlock.ErrInvalidKey, "keyspace name is empty"},
		{"nil db", r.Register(ctx, nil, txlock.NewKeyspace("x")), txlock.ErrInvalidArgument, "db is nil"},
		{"nil db in Keyspaces", func() error { _, err := r.Keyspaces(ctx, nil); return err }(), txlock.ErrInvalidArgument, "db is nil"},
		{"nil db in Create", r.Create(ctx, nil), txlock.ErrInvalidArgument, "db is nil"},
		{"long table name", txlock.Registry{Table: strings.Repeat("t", 64)}.Create(ctx, db), txlock.ErrInvalidArgument, "63 bytes"},
		{"NUL in schema", txlock.Registry{Schema: "a\x00b"}.Register(ctx, db, txlock.NewKeyspace("x")), txlock.ErrInvalidArgument, "NUL"},
	} {
		assert.ErrorIs(t, tc.err, tc.is, tc.name)
		assert.ErrorContains(t, tc.err, tc.msg, tc.name)
	}

	// A registry whose table does not exist says how to create it.
	err := txlock.Registry{Schema: r.Schema, Table: "missing"}.Register(ctx, db, txlock.NewKeyspace("x"))
	assert.Equal(t, "42P01", txlock.SQLState(err))
	assert.ErrorContains(t, err, "Registry.Create or migrations/0002_txlock_keyspaces.sql")
}

// TestRegistryMigrationFile: the migration file holds Registry.DDL of the
// zero Registry, and the table it creates serves the zero Registry.
func TestRegistryMigrationFile(t *testing.T) {
	ctx := context.Background()
	file, err := os.ReadFile("migrations/0002_txlock_keyspaces.sql")
	require.NoError(t, err)
	var stmt []string
	for _, line := range strings.Split(string(file), "\n") {
		if !strings.HasPrefix(line, "--") {
			stmt = append(stmt, line)
		}
	}
	ddl, err := txlock.Registry{}.DDL()
	require.NoError(t, err)
	assert.Equal(t, ddl+";", strings.TrimSpace(strings.Join(stmt, "\n")), "migrations/0002_txlock_keyspaces.sql and Registry.DDL differ")

	// In a database of its own, so that the public table of the other
	// tests' databases is left alone.
	admin := direct(t)
	db := freshDatabase(t, admin)
	for range 2 { // idempotent
		_, err = db.Exec(string(file))
		require.NoError(t, err)
	}
	require.NoError(t, txlock.Registry{}.Register(ctx, db, txlock.NewKeyspace("orders")))
	ks, err := txlock.Registry{}.Keyspaces(ctx, db)
	require.NoError(t, err)
	require.Len(t, ks, 1)
	assert.Equal(t, "orders", ks[0].String())
}

// freshDatabase creates a database on admin's server for the test, and
// returns a pool on it; the database is dropped when the test ends.
func freshDatabase(t *testing.T, admin *sql.DB) *sql.DB {
	t.Helper()
	var b [4]byte
	_, _ = rand.Read(b[:])
	name := "registry_" + hex.EncodeToString(b[:])
	_, err := admin.Exec(`CREATE DATABASE ` + name)
	require.NoError(t, err)
	u, err := url.Parse(pgtest.Postgres(t))
	require.NoError(t, err)
	u.Path = "/" + name
	dsn := u.String()
	db := open(t, dsn)
	t.Cleanup(func() {
		_, err := admin.Exec(`DROP DATABASE ` + name + ` WITH (FORCE)`)
		assert.NoError(t, err)
	})
	return db
}

// The registry's statements run in every pgx exec mode behind PgBouncer
// 1.18 in transaction mode: 16 goroutines on a pool of 32 register 8
// keyspaces 20 times each, on the pool and in a caller's transaction, so
// that each client connection meets many server connections (PgBouncer has
// 5); a clash is still found, and the list read back.
func TestRegistryInEveryExecMode(t *testing.T) {
	for _, mode := range []string{"cache_statement", "describe_exec", "cache_describe", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			r := registryIn(t, direct(t))
			db, _ := bouncer(t, mode)
			db.SetMaxOpenConns(32)
			errs := hammer(16, 20, func() error {
				name := fmt.Sprintf("svc-%d", time.Now().UnixNano()%8)
				if time.Now().UnixNano()%2 == 0 {
					return r.Register(ctx, db, txlock.NewKeyspace(name))
				}
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer func() { _ = tx.Rollback() }()
				if err := r.Register(ctx, tx, txlock.NewKeyspace(name)); err != nil {
					return err
				}
				return tx.Commit()
			})
			require.Empty(t, errs, "registrations that failed")
			a, clash := clashingNames(t)
			require.NoError(t, r.Register(ctx, db, txlock.NewKeyspace(a)))
			err := r.Register(ctx, db, txlock.NewKeyspace(clash))
			var ce *txlock.KeyspaceClashError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, a, ce.Owner)
			ks, err := r.Keyspaces(ctx, db)
			require.NoError(t, err)
			assert.Len(t, ks, 9, "the 8 keyspaces and a")
		})
	}
}
