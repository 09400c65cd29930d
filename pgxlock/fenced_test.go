package pgxlock_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/pgxlock"
)

// stockTable creates a fenced stock table holding SKU-1001 with quantity 50,
// and returns its name.
func stockTable(t *testing.T, admin *sql.DB) string {
	t.Helper()
	name := fmt.Sprintf("pgxstock_%d", time.Now().UnixNano())
	_, err := admin.Exec(`CREATE TABLE ` + name + ` (sku text PRIMARY KEY, qty int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO ` + name + ` (sku, qty) VALUES ('SKU-1001', 50)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = admin.Exec(`DROP TABLE ` + name) })
	return name
}

// Fenced writes through pgx: the statements, rules and errors of
// txlock.FencedTable, on a pool, directly and through PgBouncer in an exec
// mode that prepares nothing, and in a pgx.Tx.
func TestFencedWrites(t *testing.T) {
	for _, via := range []string{"direct", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			var pool *pgxpool.Pool
			var admin *sql.DB
			if via == "direct" {
				pool, admin = direct(t)
			} else {
				bp, a, _ := bouncer(t, "exec")
				pool, admin = bp, a
			}
			ctx := context.Background()
			name := stockTable(t, admin)
			w := txlock.FencedTable{Name: name}.On(pgxlock.QuerierOf(pool))
			sku := func(s string) []txlock.Col { return []txlock.Col{{Name: "sku", Value: s}} }
			qty := func(n int) []txlock.Col { return []txlock.Col{{Name: "qty", Value: n}} }

			n, err := w.Update(ctx, 2, qty(42), sku("SKU-1001"))
			require.NoError(t, err)
			assert.EqualValues(t, 1, n)
			_, err = w.Update(ctx, 1, qty(49), sku("SKU-1001"))
			var stale *txlock.StaleTokenError
			require.ErrorAs(t, err, &stale)
			assert.EqualValues(t, 2, stale.Current)
			_, err = w.Update(ctx, 5, qty(1), sku("SKU-404"))
			assert.ErrorIs(t, err, txlock.ErrRowNotFound)

			require.NoError(t, w.Upsert(ctx, 3, sku("SKU-2002"), qty(7)))
			require.NoError(t, w.Upsert(ctx, 4, sku("SKU-2002"), qty(8)))
			assert.ErrorIs(t, w.Upsert(ctx, 3, sku("SKU-2002"), qty(9)), txlock.ErrStaleToken)
			_, err = w.Delete(ctx, 3, sku("SKU-2002"))
			assert.ErrorIs(t, err, txlock.ErrStaleToken)
			n, err = w.Delete(ctx, 4, sku("SKU-2002"))
			require.NoError(t, err)
			assert.EqualValues(t, 1, n)

			// In a pgx.Tx: the write is the transaction's, and goes with
			// its rollback.
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = txlock.FencedTable{Name: name}.On(pgxlock.QuerierOf(tx)).Update(ctx, 9, qty(1), sku("SKU-1001"))
			require.NoError(t, err)
			require.NoError(t, tx.Rollback(ctx))
			var q int
			var tok int64
			require.NoError(t, admin.QueryRow(`SELECT qty, fence_token FROM `+name+` WHERE sku = 'SKU-1001'`).Scan(&q, &tok))
			assert.Equal(t, 42, q)
			assert.EqualValues(t, 2, tok)
		})
	}
}

// The whole flow in pgx: a holder draws its token in pgxlock.WithLock's fn
// and writes with it; a write with an older token is refused, and the
// refusal is reported to the call's Observer.
func TestFencedWriteInLock(t *testing.T) {
	pool, admin := direct(t)
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, admin))
	name := stockTable(t, admin)
	w := txlock.FencedTable{Name: name}.On(pgxlock.QuerierOf(pool))
	sku := []txlock.Col{{Name: "sku", Value: "SKU-1001"}}
	var mu sync.Mutex
	var kinds []txlock.EventKind
	obs := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		mu.Lock()
		kinds = append(kinds, e.Kind)
		mu.Unlock()
		return ctx
	})
	key := txlock.StringKey(uniq(t))
	var first int64
	require.NoError(t, pgxlock.WithLock(ctx, pool, key, func(ctx context.Context, _ pgx.Tx) error {
		tok, err := txlock.FenceToken(ctx)
		if err != nil {
			return err
		}
		first = tok
		_, err = w.Update(ctx, tok, []txlock.Col{{Name: "qty", Value: 49}}, sku)
		return err
	}))
	require.NoError(t, pgxlock.WithLock(ctx, pool, key, func(ctx context.Context, _ pgx.Tx) error {
		tok, err := txlock.FenceToken(ctx)
		if err != nil {
			return err
		}
		assert.Greater(t, tok, first)
		_, err = w.Update(ctx, tok, []txlock.Col{{Name: "qty", Value: 48}}, sku)
		return err
	}))
	// The first holder, paused past its lock, writes with its old token.
	err := pgxlock.WithLock(ctx, pool, key, func(ctx context.Context, _ pgx.Tx) error {
		_, err := w.Update(ctx, first, []txlock.Col{{Name: "qty", Value: 0}}, sku)
		return err
	}, txlock.WithObserver(obs))
	assert.ErrorIs(t, err, txlock.ErrStaleToken)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, kinds, txlock.StaleWrite, "the refusal is the call's event")
}

func TestFencedWritesNilQuerier(t *testing.T) {
	var pool *pgxpool.Pool
	var tx pgx.Tx
	for _, q := range []pgxlock.RowQuerier{pool, tx} {
		_, err := txlock.FencedTable{Name: "stock"}.On(pgxlock.QuerierOf(q)).Update(context.Background(), 1, []txlock.Col{{Name: "qty", Value: 1}}, []txlock.Col{{Name: "sku", Value: "x"}})
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	}
}
