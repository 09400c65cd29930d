package txlock_test

import (
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
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

// sqlSemaphore is txlock's WithSemaphore and TryWithSemaphore on db, for
// locktest's semaphore checks.
func sqlSemaphore(db *sql.DB) (locktest.SemaphoreFunc, locktest.TrySemaphoreFunc) {
	sqlFn := func(fn func(context.Context, locktest.Tx) error) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, locktest.SQLTx{Tx: tx}) }
	}
	return func(ctx context.Context, key txlock.Key, n int, fn func(context.Context, locktest.Tx) error, opts ...txlock.Option) error {
			return txlock.WithSemaphore(ctx, db, key, n, sqlFn(fn), opts...)
		}, func(ctx context.Context, key txlock.Key, n int, fn func(context.Context, locktest.Tx) error, opts ...txlock.Option) (bool, error) {
			return txlock.TryWithSemaphore(ctx, db, key, n, sqlFn(fn), opts...)
		}
}

func TestSemaphore(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			admin := direct(t)
			db := admin
			if via == "PgBouncer" {
				db, _ = bouncer(t, "exec")
			}
			with, try := sqlSemaphore(db)
			locktest.RequireSemaphore(t, admin, with, try)
		})
	}
}

// SlotKey's documented SQL gives the same keys, for both kinds of key.
func TestSlotKeySQL(t *testing.T) {
	db := direct(t)
	r := rand.New(rand.NewPCG(1, 2))
	keys := []txlock.Key{txlock.StringKey("orders-export"), txlock.Int64Key(0), txlock.Int64Key(-1), txlock.PairKey(-5, 7),
		txlock.NewKeyspace("billing").Key("export"), txlock.Int64Key(1 << 62)}
	for range 40 {
		keys = append(keys, txlock.Int64Key(int64(r.Uint64())), txlock.PairKey(int32(r.Uint32()), int32(r.Uint32())))
	}
	for _, k := range keys {
		for _, i := range []int{0, 1, 7, txlock.MaxKeys - 1} {
			var got int64
			require.NoError(t, db.QueryRow(`SELECT `+locktest.SlotSQL(k, i)).Scan(&got))
			want, ok := txlock.SlotKey(k, i).Int64()
			require.True(t, ok)
			require.Equal(t, want, got, "slot %d of %s", i, k)
		}
	}
	assert.NotEqual(t, txlock.SlotKey(txlock.Int64Key(5), 0), txlock.SlotKey(txlock.PairKey(0, 5), 0), "the kinds' slots differ")
}

// An operator's psql takes two of three slots by hand, with SlotKey's SQL,
// directly and through PgBouncer: callers then run one at a time, in the
// third, until psql lets go.
func TestSemaphoreByHand(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			db, url := direct(t), pgtest.Postgres(t)
			if via == "PgBouncer" {
				db, _ = bouncer(t, "exec")
				url, _ = pgtest.PgBouncer(t)
			}
			with, try := sqlSemaphore(db)
			locktest.SemaphoreByHand(t, direct(t), url, with, try)
		})
	}
}

// Semaphores across processes: the test binary re-executes itself as
// holder processes, which get the server's URL from their environment.
func init() {
	if os.Getenv(locktest.SemaphoreChildEnv) != "" {
		os.Exit(locktest.SemaphoreChild(func(url string, workers int) (locktest.SemaphoreFunc, func(), error) {
			db, err := sql.Open("pgx", url)
			if err != nil {
				return nil, nil, err
			}
			db.SetMaxOpenConns(workers)
			with, _ := sqlSemaphore(db)
			return with, func() { db.Close() }, nil
		}))
	}
}

// Five processes of three workers each share a semaphore of 3 slots for
// two seconds, directly and through PgBouncer (locktest's
// SemaphoresAcrossProcesses says what it checks).
func TestSemaphoreAcrossProcesses(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			locktest.SemaphoresAcrossProcesses(t, direct(t), childURL(t, via))
		})
	}
}

// A semaphore takes WithLock's options: events name the slot, the hold
// bound ends a holder that outlives it, and fencing tokens are drawn.
func TestSemaphoreOptions(t *testing.T) {
	ctx := context.Background()
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, db))

	var mu sync.Mutex
	var kinds []string
	obs := txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		mu.Lock()
		defer mu.Unlock()
		kinds = append(kinds, fmt.Sprintf("%v %d/%d", e.Kind, e.Slot, e.Slots))
		return ctx
	})
	var slot int
	err := txlock.WithSemaphore(ctx, db, key, 4, func(ctx context.Context, tx *sql.Tx) error {
		l, _ := txlock.LockFromContext(ctx)
		slot = l.Slot
		_, err := txlock.FenceToken(ctx)
		return err
	}, txlock.WithObserver(obs), txlock.WithFencing(), txlock.WithOwner("exporter"))
	require.NoError(t, err)
	mu.Lock()
	joined := strings.Join(kinds, ", ")
	mu.Unlock()
	want := fmt.Sprintf("%v 0/4, %v %d/4, %v %d/4, %v %d/4", txlock.WaitStarted, txlock.Acquired, slot, txlock.TokenIssued, slot, txlock.Released, slot)
	assert.Equal(t, want, joined)

	err = txlock.WithSemaphore(ctx, db, key, 2, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, "SELECT pg_sleep(2)")
		return err
	}, txlock.WithMaxHold(300*time.Millisecond))
	assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
}

// A semaphore on a standby is refused, as a lock is.
func TestSemaphoreStandby(t *testing.T) {
	standby := open(t, pgtest.Standby(t))
	err := txlock.WithSemaphore(context.Background(), standby, txlock.StringKey(uniq(t)), 2, func(context.Context, *sql.Tx) error {
		t.Error("fn ran on a standby")
		return nil
	})
	assert.ErrorIs(t, err, txlock.ErrStandby)
}

func TestSemaphoreBadInput(t *testing.T) {
	ctx := context.Background()
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	fn := func(context.Context, *sql.Tx) error {
		t.Error("fn ran")
		return nil
	}
	for _, tc := range []struct {
		name string
		key  txlock.Key
		n    int
		opts []txlock.Option
		want string
	}{
		{"n 0", key, 0, nil, "between 1 and MaxKeys (1000), got 0"},
		{"n negative", key, -3, nil, "got -3"},
		{"n too large", key, txlock.MaxKeys + 1, nil, "got 1001"},
		{"shared", key, 2, []txlock.Option{txlock.WithShared()}, "WithShared does not apply to a semaphore"},
		{"server wait", key, 2, []txlock.Option{txlock.WithServerWait(txlock.ServerWait{})}, "WithServerWait does not apply to a semaphore"},
		{"bad key", txlock.StringKey(""), 2, nil, "key name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := txlock.WithSemaphore(ctx, db, tc.key, tc.n, fn, tc.opts...)
			assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
			assert.ErrorContains(t, err, tc.want)
			_, err = txlock.TryWithSemaphore(ctx, db, tc.key, tc.n, fn, tc.opts...)
			assert.ErrorContains(t, err, tc.want)
		})
	}
	assert.ErrorIs(t, txlock.WithSemaphore(ctx, db, key, 2, nil), txlock.ErrInvalidArgument)
	assert.ErrorIs(t, txlock.WithSemaphore(ctx, nil, key, 2, fn), txlock.ErrInvalidArgument)
	assert.ErrorIs(t, txlock.SlotKey(key, -1).Err(), txlock.ErrInvalidKey)
	assert.ErrorIs(t, txlock.SlotKey(key, txlock.MaxKeys).Err(), txlock.ErrInvalidKey)
	assert.ErrorIs(t, txlock.SlotKey(txlock.Key{}, 0).Err(), txlock.ErrInvalidKey)
}

// A semaphore whose every slot stays busy times out with an error that
// says it is a semaphore, of how many slots, and carries n (Slots), so
// that an operator can find its slots' keys in pg_locks.
func TestSemaphoreTimeoutNamesItsSlots(t *testing.T) {
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	hold(t, db, txlock.SlotKey(key, 0), false)
	hold(t, db, txlock.SlotKey(key, 1), false)
	err := txlock.WithSemaphore(context.Background(), db, key, 2, func(context.Context, *sql.Tx) error {
		t.Error("fn ran")
		return nil
	}, txlock.WithTimeout(200*time.Millisecond))
	require.ErrorIs(t, err, txlock.ErrLockTimeout)
	var te *txlock.LockTimeoutError
	require.ErrorAs(t, err, &te)
	assert.Equal(t, 2, te.Slots)
	assert.Equal(t, []txlock.Key{key}, te.Keys)
	assert.ErrorContains(t, err, "a semaphore of 2 slots (SlotKey(key, 0 to 1)), not granted after")
}

// A process's local queue lets n callers of a semaphore of n slots make
// attempts at once, and queues the rest: with every slot held by another
// session, 12 callers of a semaphore of 3 each try once, and then exactly
// 3 of them go on polling until their timeout, while the other 9 wait in
// the queue, with an attempt or two more at most (a turn handed on as the
// deadline comes).
func TestSemaphoreLocalQueueAdmitsN(t *testing.T) {
	const n, callers = 3, 12
	db := direct(t)
	key := txlock.StringKey(uniq(t))
	for i := range n {
		hold(t, db, txlock.SlotKey(key, i), false)
	}
	attempts := make(chan int, callers)
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			err := txlock.WithSemaphore(context.Background(), db, key, n, func(context.Context, *sql.Tx) error {
				t.Error("fn ran")
				return nil
			}, txlock.WithTimeout(time.Second))
			var te *txlock.LockTimeoutError
			if assert.ErrorAs(t, err, &te) {
				attempts <- te.Attempts
			}
		})
	}
	wg.Wait()
	close(attempts)
	var polled, all []int
	for a := range attempts {
		all = append(all, a)
		if a > 5 { // a poller makes 20 to 30 in the second; a queued caller 1 to 3
			polled = append(polled, a)
		}
	}
	assert.Len(t, polled, n, "callers that went on polling, of attempts %v", all)
}
