package txlock_test

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// Every statement txlock sends itself for fencing tokens works in every pgx
// exec mode behind PgBouncer 1.18 in transaction mode: 15 goroutines on a
// pool of 32, over 3 keys, draw 750 tokens, about half with WithFencing,
// so that each client connection meets many server connections (PgBouncer
// has 5); every draw succeeds and every token is distinct. (Three keys:
// the holders that draw without WithFencing draw on a server connection
// of their own, beside the three holders' and the one that the WithFencing
// calls' draw connection keeps: see docs/fencing.md.) Where the mode lets the
// caller's own bind parameters through (not cache_statement or
// describe_exec, which fail for any parameterized query there), every
// holder also makes a fenced write of its key's row with its token, on the
// pool, outside the lock's transaction, concurrently with the other keys'
// holders: every write succeeds, and each row ends with its key's last
// token and the number of writes made to it. (Those holders poll for the
// lock, with WithRetry(ExponentialBackoff{}): see below.) Terms, which draw
// a token at their start, run in every mode.
func TestTokensInEveryExecMode(t *testing.T) {
	const workers, iters, keys = 15, 50, 3
	for _, tc := range []struct {
		mode        string
		fencedWrite bool
	}{
		{"cache_statement", false},
		{"describe_exec", false},
		{"cache_describe", true},
		{"exec", true},
		{"simple_protocol", true},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			db, _ := bouncer(t, tc.mode)
			db.SetMaxOpenConns(32)
			admin := direct(t)
			ft := stockTable(t, admin)
			ctx := context.Background()
			sku := func(k int) string { return fmt.Sprintf("SKU-K%d", k) }
			for k := range keys {
				_, err := admin.Exec(`INSERT INTO `+ft.Name+` (sku, qty) VALUES ($1, 0)`, sku(k))
				require.NoError(t, err)
			}
			var mu sync.Mutex
			seen := map[int64]bool{}
			var last [keys]int64 // the largest token issued for each key
			var writes [keys]int // the fenced writes made to each key's row
			errs := make(chan error, workers*iters)
			var wg sync.WaitGroup
			for w := range workers {
				k := w % keys
				key := txlock.StringKey(fmt.Sprintf("%s/%d", t.Name(), k))
				opts := []txlock.Option{txlock.WithTimeout(30 * time.Second)}
				if w%2 == 0 {
					opts = append(opts, txlock.WithFencing())
				}
				if tc.fencedWrite {
					// With the default strategy each key's next caller
					// waits in the server's lock queue for up to 200ms, on
					// a server connection: three holders, the draw
					// connection and such waits fill PgBouncer's five, and
					// a write outside the transaction waits for one of
					// them to end.
					opts = append(opts, txlock.WithRetry(txlock.ExponentialBackoff{}))
				}
				wg.Go(func() {
					for range iters {
						errs <- txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
							tok, err := txlock.FenceToken(ctx)
							if err != nil {
								return err
							}
							mu.Lock()
							dup := seen[tok]
							seen[tok] = true
							last[k] = max(last[k], tok)
							if tc.fencedWrite {
								writes[k]++
							}
							n := writes[k]
							mu.Unlock()
							if dup {
								return fmt.Errorf("token %d issued twice", tok)
							}
							if !tc.fencedWrite {
								return nil
							}
							written, err := ft.Update(ctx, db, tok, []txlock.Col{{Name: "qty", Value: n}}, []txlock.Col{{Name: "sku", Value: sku(k)}})
							if err == nil && written != 1 {
								err = fmt.Errorf("fenced write of %s wrote %d rows", sku(k), written)
							}
							return err
						}, opts...)
					}
				})
			}
			wg.Wait()
			close(errs)
			failed := map[string]int{}
			for err := range errs {
				if err != nil {
					failed[err.Error()]++
				}
			}
			require.Empty(t, failed, "draws and fenced writes that failed, by error")
			assert.Len(t, seen, workers*iters)

			if tc.fencedWrite {
				for k := range keys {
					var qty int
					var tok int64
					require.NoError(t, admin.QueryRow(`SELECT qty, fence_token FROM `+ft.Name+` WHERE sku = $1`, sku(k)).Scan(&qty, &tok))
					assert.Equal(t, workers/keys*iters, writes[k], "holders of key %d", k)
					assert.Equal(t, writes[k], qty, "fenced writes of %s", sku(k))
					assert.Equal(t, last[k], tok, "the token of %s", sku(k))
				}
			}

			beat := txlock.Heartbeat{Interval: 100 * time.Millisecond, Timeout: 2 * time.Second, TTL: 5 * time.Second}
			var twg sync.WaitGroup
			terms := make(chan error, 4*5)
			for w := range 4 {
				key := txlock.StringKey(fmt.Sprintf("%s/term/%d", uniq(t), w))
				twg.Go(func() {
					for range 5 {
						term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(beat), txlock.WithTimeout(30*time.Second))
						if err == nil {
							if term.Token() <= 0 {
								err = fmt.Errorf("term token %d", term.Token())
							}
							err = errorsJoin(err, term.Release(ctx))
						}
						terms <- err
					}
				})
			}
			twg.Wait()
			close(terms)
			for err := range terms {
				assert.NoError(t, err, "a term in exec mode %s", tc.mode)
			}
		})
	}
}

func errorsJoin(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// N holders on a pool of N connections that all draw tokens all succeed
// with WithFencing, directly and through PgBouncer, on database/sql: the
// draw's connection is set aside before the lock is taken. Without it,
// holders that fill the pool and then draw fail at once with ErrNoToken,
// which names WithFencing, instead of waiting for ever (or for their
// deadline) for a connection none of them will give back.
func TestHoldersDrawOnTheirOwnPool(t *testing.T) {
	const iters = 50
	for _, route := range []string{"direct", "pgbouncer"} {
		t.Run(route, func(t *testing.T) {
			url, n := pgtest.Postgres(t), 4
			if route == "pgbouncer" {
				var admin string
				url, admin = pgtest.PgBouncer(t)
				url += "&default_query_exec_mode=exec"
				// More holders than PgBouncer has server connections:
				// the draw connection keeps one of them.
				n = locktest.BouncerPoolSize(t, admin) + 2
			}
			admin := direct(t)
			require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
			lock := func(db *sql.DB) locktest.Drawer {
				return func(ctx context.Context, key txlock.Key, fencing bool, body func(context.Context) error) error {
					var opts []txlock.Option
					if fencing {
						opts = append(opts, txlock.WithFencing())
					}
					return txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error { return body(ctx) }, opts...)
				}
			}
			t.Run("WithFencing", func(t *testing.T) {
				db := open(t, url)
				db.SetMaxOpenConns(n)
				start := time.Now()
				require.Empty(t, locktest.DrawingHolders(t, n, iters, lock(db)))
				t.Logf("%d holders on a pool of %d drew %d tokens in %v", n, n, n*iters, time.Since(start).Round(time.Millisecond))
				require.Eventually(t, func() bool { return db.Stats().InUse == 0 }, 5*time.Second, 10*time.Millisecond, "the draw's connection went back to the pool")
			})
			// Without WithFencing, holders that fill the pool: at most as
			// many as PgBouncer's server connections, which they all keep.
			t.Run("without", func(t *testing.T) {
				db := open(t, url)
				db.SetMaxOpenConns(4)
				locktest.FullPoolDraws(t, 4, lock(db))
			})
		})
	}
}

// The connection WithFencing sets aside keeps its server connection
// through PgBouncer while holders keep all the others, and holds nothing
// there: idle in a transaction with no transaction id and no snapshot
// (locktest.PinnedDraws). The server's idle-in-transaction and transaction
// timeouts do not end it: with both at 200ms for the pool's sessions, a
// token is drawn after the draw connection has waited 600ms.
func TestDrawConnectionKeepsItsServer(t *testing.T) {
	admin := direct(t)
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
	lock := func(db *sql.DB) locktest.Drawer {
		return func(ctx context.Context, key txlock.Key, fencing bool, body func(context.Context) error) error {
			return txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error { return body(ctx) }, txlock.WithFencing())
		}
	}
	t.Run("direct", func(t *testing.T) {
		locktest.PinnedDraws(t, admin, 0, lock(open(t, pgtest.Postgres(t))))
	})
	for _, mode := range []string{"cache_statement", "exec"} {
		t.Run("pgbouncer/"+mode, func(t *testing.T) {
			db, adminURL := bouncer(t, mode)
			locktest.PinnedDraws(t, admin, locktest.BouncerPoolSize(t, adminURL), lock(db))
		})
	}
	t.Run("timeouts", func(t *testing.T) {
		url := pgtest.Postgres(t) + "&idle_in_transaction_session_timeout=1s" // a loaded machine's pause between two statements stays below it
		var version int
		require.NoError(t, admin.QueryRow(`SELECT current_setting('server_version_num')::int`).Scan(&version))
		if version >= 170000 {
			url += "&transaction_timeout=1s"
		}
		db := open(t, url)
		err := txlock.WithLock(context.Background(), db, txlock.StringKey(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
			// The lock's own transaction is spared as the draw's is.
			if _, err := tx.ExecContext(ctx, `SELECT set_config('idle_in_transaction_session_timeout', '0', true),
				CASE WHEN current_setting('transaction_timeout', true) IS NOT NULL THEN set_config('transaction_timeout', '0', true) END`); err != nil {
				return err
			}
			time.Sleep(3 * time.Second) // past both timeouts
			_, err := txlock.FenceToken(ctx)
			return err
		}, txlock.WithFencing())
		require.NoError(t, err)
	})
}

// WithFencing needs a pool it can set a connection aside in: a single
// connection, or a pool of one, is refused before anything is locked.
func TestWithFencingNeedsAPool(t *testing.T) {
	db := direct(t)
	ctx := context.Background()
	nop := func(context.Context, *sql.Tx) error { return nil }
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	err = txlock.WithLock(ctx, conn, txlock.StringKey(uniq(t)), nop, txlock.WithFencing())
	require.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "not a pool")
	one := open(t, pgtest.Postgres(t))
	one.SetMaxOpenConns(1)
	err = txlock.WithLock(ctx, one, txlock.StringKey(uniq(t)), nop, txlock.WithFencing())
	require.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "SetMaxOpenConns(1)")
	err = txlock.LockTx(ctx, nil, txlock.StringKey(uniq(t)), txlock.WithFencing())
	require.ErrorIs(t, err, txlock.ErrInvalidArgument)
}
