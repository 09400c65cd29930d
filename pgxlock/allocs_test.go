package pgxlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/lockstmt"
	"github.com/txlock/txlock/pgxlock"
)

// contexts are the kinds of context a call may get: each costs the lock
// something different (a deadline of the caller's own spares the lock its
// own timer).
func contexts() map[string]func() (context.Context, context.CancelFunc) {
	return map[string]func() (context.Context, context.CancelFunc){
		"background":  func() (context.Context, context.CancelFunc) { return context.Background(), func() {} },
		"cancellable": func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) },
		"deadline": func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Second)
		},
	}
}

// An uncontended call allocates at most 10 more times than a plain pgx
// transaction of the same work, whatever its context.
func TestAllocs(t *testing.T) {
	pool, _ := direct(t)
	key := txlock.Int64Key(7)
	read := func(ctx context.Context, tx pgx.Tx) error {
		var one int
		return tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
	}
	// A call whose queue's hint says its lock was busy within the last
	// second queues first and waits in the server (queue.go's
	// recentlyBusy), which allocates more. The hint has 64 slots that
	// every pool's queues share, so an earlier test's busy lock can mark
	// this key's slot: let any such hint lapse.
	time.Sleep(1100 * time.Millisecond)
	for name, mk := range contexts() {
		t.Run(name, func(t *testing.T) {
			var err error
			plain := testing.AllocsPerRun(50, func() {
				ctx, cancel := mk()
				defer cancel()
				err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return read(ctx, tx) })
			})
			require.NoError(t, err)
			locked := testing.AllocsPerRun(50, func() {
				ctx, cancel := mk()
				defer cancel()
				err = pgxlock.WithLock(ctx, pool, key, read)
			})
			require.NoError(t, err)
			t.Logf("allocs per call: plain pgx transaction %.0f, pgxlock.WithLock %.0f", plain, locked)
			assert.LessOrEqual(t, locked, plain+12)
		})
	}
}

func BenchmarkWithLock(b *testing.B) {
	pool, _ := direct(b)
	key := txlock.Int64Key(8)
	read := func(ctx context.Context, tx pgx.Tx) error {
		var one int
		return tx.QueryRow(ctx, `SELECT 1`).Scan(&one)
	}
	for name, mk := range contexts() {
		b.Run("plain-pgx/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := mk()
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return read(ctx, tx) }); err != nil {
					b.Fatal(err)
				}
				cancel()
			}
		})
		b.Run("pgxlock/"+name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				ctx, cancel := mk()
				if err := pgxlock.WithLock(ctx, pool, key, read); err != nil {
					b.Fatal(err)
				}
				cancel()
			}
		})
		// The cost of naming the holder (WithOwner), beside pgxlock's.
		b.Run("pgxlock+owner/"+name, func(b *testing.B) {
			b.ReportAllocs()
			owner := txlock.WithOwner("export-worker host-a pid 42 req 7f3a")
			for b.Loop() {
				ctx, cancel := mk()
				if err := pgxlock.WithLock(ctx, pool, key, read, owner); err != nil {
					b.Fatal(err)
				}
				cancel()
			}
		})
	}
}

// BenchmarkStatementCost measures, on one connection of the pool, what the
// lock statement costs the server beside the bare lock, with and without a
// hold bound: each op is the query, sent by hand as pgxlock sends it, and
// COMMIT.
//
//	go test -run '^$' -bench StatementCost -count 6 ./pgxlock
func BenchmarkStatementCost(b *testing.B) {
	pool, _ := direct(b)
	const key = 4243
	for _, v := range []struct{ name, query string }{
		{"bare-lock-then-begin", "SELECT pg_catalog.pg_try_advisory_xact_lock('4243'::bigint); BEGIN"},
		{"begin-then-bare-lock", "BEGIN; SELECT pg_catalog.pg_try_advisory_xact_lock('4243'::bigint)"},
		{"pgxlock-statement", lockstmt.Begin(key, 0)},
		{"pgxlock-statement+maxhold", lockstmt.Begin(key, 30*time.Second)},
	} {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			c, err := pool.Acquire(ctx)
			require.NoError(b, err)
			defer c.Release()
			for b.Loop() {
				if _, err := c.Conn().PgConn().Exec(ctx, v.query).ReadAll(); err != nil {
					b.Fatal(err)
				}
				if _, err := c.Conn().Exec(ctx, "COMMIT"); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
