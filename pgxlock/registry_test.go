package pgxlock_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// The keyspace registry on pgx (Registry.On with QuerierOf): its table
// made with DDL's statement, registrations, a clash, and the list, directly
// and through PgBouncer (TestRegistryInEveryExecMode runs every exec mode).
func TestRegistry(t *testing.T) {
	for _, via := range []struct{ name, url, mode string }{
		{"direct", pgtest.Postgres(t), ""},
		{"PgBouncer", bouncerURL(t), "exec"},
	} {
		t.Run(via.name, func(t *testing.T) {
			ctx := context.Background()
			_, admin := direct(t)
			pool := newPool(t, via.url, via.mode, 4)
			var b [4]byte
			_, _ = rand.Read(b[:])
			r := txlock.Registry{Schema: "registry_" + hex.EncodeToString(b[:])}
			_, err := admin.Exec(`CREATE SCHEMA ` + r.Schema)
			require.NoError(t, err)
			t.Cleanup(func() {
				_, err := admin.Exec(`DROP SCHEMA ` + r.Schema + ` CASCADE`)
				assert.NoError(t, err)
			})
			ddl, err := r.DDL()
			require.NoError(t, err)
			_, err = pool.Exec(ctx, ddl)
			require.NoError(t, err)

			reg := r.On(pgxlock.QuerierOf(pool))
			ks, err := reg.Keyspaces(ctx)
			require.NoError(t, err)
			assert.Empty(t, ks)
			a, clash := locktest.ClashingNames(t)
			for _, name := range []string{"orders", a, "orders"} {
				require.NoError(t, reg.Register(ctx, txlock.NewKeyspace(name)), name)
			}
			err = reg.Register(ctx, txlock.NewKeyspace(clash))
			require.ErrorIs(t, err, txlock.ErrKeyspaceClash)
			var ce *txlock.KeyspaceClashError
			require.ErrorAs(t, err, &ce)
			assert.Equal(t, a, ce.Owner)
			assert.Equal(t, clash, ce.Name)

			ks, err = reg.Keyspaces(ctx)
			require.NoError(t, err)
			var names []string
			for _, k := range ks {
				names = append(names, k.String())
			}
			assert.Equal(t, []string{"orders", a}, names, "one row per name, ordered by name")
			sqlKs, err := r.Keyspaces(ctx, admin)
			require.NoError(t, err)
			assert.Equal(t, ks, sqlKs, "database/sql reads the same keyspaces")

			_, err = txlock.Registry{}.On(nil).Keyspaces(ctx)
			assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
			assert.ErrorIs(t, txlock.Registry{}.On(pgxlock.QuerierOf(nil)).Register(ctx, txlock.NewKeyspace("x")), txlock.ErrInvalidArgument)
		})
	}
}

// The registry's statements run in every pgx exec mode behind PgBouncer
// 1.18 in transaction mode: 16 goroutines on a pool of 32 register 8
// keyspaces 20 times each, on the pool and in a caller's transaction; a
// clash is still found, and the list read back.
func TestRegistryInEveryExecMode(t *testing.T) {
	for _, mode := range []string{"cache_statement", "describe_exec", "cache_describe", "exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			_, admin := direct(t)
			var b [4]byte
			_, _ = rand.Read(b[:])
			r := txlock.Registry{Schema: "registry_" + hex.EncodeToString(b[:])}
			_, err := admin.Exec(`CREATE SCHEMA ` + r.Schema)
			require.NoError(t, err)
			t.Cleanup(func() {
				_, err := admin.Exec(`DROP SCHEMA ` + r.Schema + ` CASCADE`)
				assert.NoError(t, err)
			})
			require.NoError(t, r.Create(ctx, admin))
			pool := newPool(t, bouncerURL(t), mode, 32)
			var n atomic.Int64
			errs := hammer(16, 20, func() error {
				i := n.Add(1)
				ks := txlock.NewKeyspace(fmt.Sprintf("svc-%d", i%8))
				if i%2 == 0 {
					return r.On(pgxlock.QuerierOf(pool)).Register(ctx, ks)
				}
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					return r.On(pgxlock.QuerierOf(tx)).Register(ctx, ks)
				})
			})
			require.Empty(t, errs, "registrations that failed")
			reg := r.On(pgxlock.QuerierOf(pool))
			a, clash := locktest.ClashingNames(t)
			require.NoError(t, reg.Register(ctx, txlock.NewKeyspace(a)))
			var ce *txlock.KeyspaceClashError
			require.ErrorAs(t, reg.Register(ctx, txlock.NewKeyspace(clash)), &ce)
			assert.Equal(t, a, ce.Owner)
			ks, err := reg.Keyspaces(ctx)
			require.NoError(t, err)
			assert.Len(t, ks, 9, "the 8 keyspaces and a")
		})
	}
}
