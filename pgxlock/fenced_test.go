package pgxlock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
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

// Fenced writes in every pgx exec mode, made concurrently by holders that
// draw their tokens (WithFencing) in that mode: 15 workers on a pool of 20,
// over 3 keys, each holder writing its key's row with its token, so that
// each client connection meets many server connections behind PgBouncer
// (which has 5). Every draw succeeds, and every token is distinct.
// Directly, the writes run on the pool in all five modes; through PgBouncer
// 1.18 in transaction mode, on the pool in the modes that let the caller's
// bind parameters through (exec, simple_protocol, cache_describe), and on
// the lock's own transaction in the two that do not: there describe_exec
// works, and cache_statement does not. Every write that succeeds is the
// row's: each row ends with the token and the count of its key's last
// successful write.
func TestFencedWritesInEveryExecMode(t *testing.T) {
	const workers, iters, keys = 15, 25, 3
	errWrite := errors.New("fenced write")
	for _, tc := range []struct {
		name   string
		mode   string
		bounce bool
		onTx   bool // the writes run on the lock's transaction, not on the pool
		lost   bool // writes can fail: their prepared statement lost, or another client's
	}{
		{name: "direct/cache_statement", mode: "cache_statement"},
		{name: "direct/describe_exec", mode: "describe_exec"},
		{name: "direct/cache_describe", mode: "cache_describe"},
		{name: "direct/exec", mode: "exec"},
		{name: "direct/simple_protocol", mode: "simple_protocol"},
		{name: "pgbouncer/exec", mode: "exec", bounce: true},
		{name: "pgbouncer/simple_protocol", mode: "simple_protocol", bounce: true},
		{name: "pgbouncer/cache_describe", mode: "cache_describe", bounce: true},
		// Works: PgBouncer keeps a transaction on one server connection, so
		// the statement described in one round trip is there for the next.
		{name: "pgbouncer/describe_exec/tx", mode: "describe_exec", bounce: true, onTx: true},
		// Fails: pgx names a statement after its text and keeps it per client
		// connection, but it lives on whichever server connection the
		// transaction got (42P05 already exists, 26000 does not exist).
		{name: "pgbouncer/cache_statement/tx", mode: "cache_statement", bounce: true, onTx: true, lost: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pool *pgxpool.Pool
			var admin *sql.DB
			opts := []txlock.Option{txlock.WithFencing(), txlock.WithTimeout(30 * time.Second)}
			if tc.bounce {
				pool, admin, _ = bouncer(t, tc.mode)
				// Three keys: three holders, the draw connection that
				// WithFencing keeps, and the write each holder makes on
				// the pool fill PgBouncer's five. With the default
				// strategy each key's next caller would also wait in the
				// server's lock queue for up to 200ms on a server
				// connection, and the writes would wait for one to end.
				opts = append(opts, txlock.WithRetry(txlock.ExponentialBackoff{}))
			} else {
				_, admin = direct(t)
				pool = newPool(t, pgtest.Postgres(t), tc.mode, 20)
			}
			ctx := context.Background()
			require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, admin))
			ft := txlock.FencedTable{Name: stockTable(t, admin)}
			sku := func(k int) string { return fmt.Sprintf("SKU-K%d", k) }
			for k := range keys {
				_, err := admin.Exec(`INSERT INTO `+ft.Name+` (sku, qty) VALUES ($1, 0)`, sku(k))
				require.NoError(t, err)
			}
			if tc.lost {
				// One holder after another, each with a pool of its own, new
				// to the statement: the write of one whose transaction lands
				// on a server connection where an earlier one prepared the
				// statement fails (42P05), and any other succeeds.
				url, _ := pgtest.PgBouncer(t)
				ft := txlock.FencedTable{Name: stockTable(t, admin)}
				prepared := map[int32]bool{} // the backends where a write prepared it
				key := txlock.StringKey(uniq(t))
				for met := false; !met; {
					require.Less(t, len(prepared), 50, "no two holders met on a server connection")
					var pid int32
					err := pgxlock.WithLock(ctx, newPool(t, url, tc.mode, 2), key, func(ctx context.Context, tx pgx.Tx) error {
						tok, err := txlock.FenceToken(ctx)
						if err != nil {
							return err
						}
						if err := tx.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`, pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
							return err
						}
						_, err = ft.On(pgxlock.QuerierOf(tx)).Update(ctx, tok, []txlock.Col{{Name: "qty", Value: 1}}, []txlock.Col{{Name: "sku", Value: "SKU-1001"}})
						return err
					}, opts...)
					if met = prepared[pid]; met {
						assert.Equal(t, "42P05", txlock.SQLState(err), "a write on backend %d, where an earlier one prepared the statement: %v", pid, err)
						t.Logf("holder %d met an earlier one on backend %d: %v", len(prepared)+1, pid, err)
					} else {
						require.NoError(t, err, "the first write on backend %d", pid)
						prepared[pid] = true
					}
				}
			}

			var mu sync.Mutex
			seen := map[int64]bool{}
			var last [keys]int64 // the token of each key's last successful write
			var writes [keys]int // the successful writes of each key's row
			errs := make(chan error, workers*iters)
			base := uniq(t)
			var wg sync.WaitGroup
			for w := range workers {
				k := w % keys
				key := txlock.StringKey(fmt.Sprintf("%s/%d", base, k))
				wg.Go(func() {
					for range iters {
						errs <- pgxlock.WithLock(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) error {
							tok, err := txlock.FenceToken(ctx)
							if err != nil {
								return err
							}
							mu.Lock()
							dup := seen[tok]
							seen[tok] = true
							n := writes[k] + 1
							mu.Unlock()
							if dup {
								return fmt.Errorf("token %d issued twice", tok)
							}
							q := pgxlock.QuerierOf(pool)
							if tc.onTx {
								q = pgxlock.QuerierOf(tx)
							}
							written, err := ft.On(q).Update(ctx, tok, []txlock.Col{{Name: "qty", Value: n}}, []txlock.Col{{Name: "sku", Value: sku(k)}})
							if err != nil {
								return fmt.Errorf("%w: %w", errWrite, err)
							}
							if written != 1 {
								return fmt.Errorf("fenced write of %s wrote %d rows", sku(k), written)
							}
							mu.Lock()
							writes[k], last[k] = n, tok
							mu.Unlock()
							return nil
						}, opts...)
					}
				})
			}
			wg.Wait()
			close(errs)
			failed := map[string]int{}
			lost := 0
			for err := range errs {
				switch {
				case err == nil:
				case tc.lost && errors.Is(err, errWrite) && slices.Contains([]string{"42P05", "26000"}, txlock.SQLState(err)):
					lost++
				default:
					failed[err.Error()]++
				}
			}
			require.Empty(t, failed, "draws and fenced writes that failed, by error")
			assert.Len(t, seen, workers*iters, "draws")
			if tc.lost {
				// Most runs lose some, a few none.
				t.Logf("%d of %d fenced writes lost their prepared statement", lost, workers*iters)
			}
			for k := range keys {
				var qty int
				var tok int64
				require.NoError(t, admin.QueryRow(`SELECT qty, fence_token FROM `+ft.Name+` WHERE sku = $1`, sku(k)).Scan(&qty, &tok))
				if !tc.lost {
					assert.Equal(t, workers/keys*iters, writes[k], "fenced writes of %s", sku(k))
				}
				assert.Equal(t, writes[k], qty, "the count in %s", sku(k))
				assert.Equal(t, last[k], tok, "the token of %s", sku(k))
			}
		})
	}
}

func TestFencedWritesNilQuerier(t *testing.T) {
	var pool *pgxpool.Pool
	var tx pgx.Tx
	for _, q := range []pgxlock.RowQuerier{pool, tx} {
		_, err := txlock.FencedTable{Name: "stock"}.On(pgxlock.QuerierOf(q)).Update(context.Background(), 1, []txlock.Col{{Name: "qty", Value: 1}}, []txlock.Col{{Name: "sku", Value: "x"}})
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	}
}

// A pgx pool creates a Fencer's sequence from its DDL, and draws its tokens
// in a lock's fn, directly and through PgBouncer.
func TestFencerDDL(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			pool, admin := direct(t)
			if via == "PgBouncer" {
				pool, admin, _ = bouncer(t, "exec")
			}
			ctx := context.Background()
			f := txlock.Fencer{Sequence: fmt.Sprintf("pgx_ddl_seq_%d", time.Now().UnixNano())}
			t.Cleanup(func() { _, _ = admin.Exec(`DROP SEQUENCE IF EXISTS public.` + f.Sequence) })
			ddl, err := f.DDL()
			require.NoError(t, err)
			for range 2 { // a second run finds it there
				_, err = pool.Exec(ctx, ddl)
				require.NoError(t, err)
			}
			var cache int64
			require.NoError(t, admin.QueryRow(`SELECT seqcache FROM pg_sequence WHERE seqrelid = $1::regclass`, "public."+f.Sequence).Scan(&cache))
			assert.Equal(t, int64(1), cache)
			var tokens []int64
			for range 2 {
				err = pgxlock.WithLock(ctx, pool, txlock.StringKey(uniq(t)), func(ctx context.Context, tx pgx.Tx) error {
					tok, err := f.Token(ctx)
					tokens = append(tokens, tok)
					return err
				})
				require.NoError(t, err)
			}
			assert.Less(t, tokens[0], tokens[1], "tokens only go up")
		})
	}
	_, err := txlock.Fencer{Sequence: "bad\x00name"}.DDL()
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
}
