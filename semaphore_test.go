package txlock_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
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

// slotSQL is SlotKey's documented SQL for a key of either kind.
func slotSQL(k txlock.Key, i int) string {
	if a, b, ok := k.Pair(); ok {
		return fmt.Sprintf(`('x' || left(encode(sha256('\x02'::bytea || int4send(%d) || int4send(%d) || int4send(%d)), 'hex'), 16))::bit(64)::bigint`, a, b, i)
	}
	v, _ := k.Int64()
	return fmt.Sprintf(`('x' || left(encode(sha256('\x01'::bytea || int8send(%d::bigint) || int4send(%d)), 'hex'), 16))::bit(64)::bigint`, v, i)
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
			require.NoError(t, db.QueryRow(`SELECT `+slotSQL(k, i)).Scan(&got))
			want, ok := txlock.SlotKey(k, i).Int64()
			require.True(t, ok)
			require.Equal(t, want, got, "slot %d of %s", i, k)
		}
	}
	assert.NotEqual(t, txlock.SlotKey(txlock.Int64Key(5), 0), txlock.SlotKey(txlock.PairKey(0, 5), 0), "the kinds' slots differ")
}

// An operator's psql takes two of three slots by hand, with SlotKey's SQL:
// callers then run one at a time, in the third, until psql lets go.
func TestSemaphoreByHand(t *testing.T) {
	ctx := context.Background()
	admin := direct(t)
	key := txlock.StringKey(uniq(t))
	name, _ := key.Int64()
	psql := exec.Command(pgtest.Psql(t), "-X", "-q", "-v", "ON_ERROR_STOP=1", pgtest.Postgres(t))
	stdin, next := runChild(t, psql)
	fmt.Fprintf(stdin, "BEGIN;\nSELECT pg_advisory_xact_lock(%s);\nSELECT pg_advisory_xact_lock(%s);\nSELECT 'held';\n",
		slotSQL(txlock.Int64Key(name), 0), slotSQL(txlock.Int64Key(name), 1))
	for next() != " held" {
	}

	ok, err := txlock.TryWithSemaphore(ctx, admin, key, 2, func(context.Context, *sql.Tx) error {
		t.Error("fn ran while psql held both slots")
		return nil
	})
	require.NoError(t, err)
	assert.False(t, ok)

	runs := locktest.NewRuns(t, admin, "txlock_sem_hand")
	errs := hammer(4, 4, func() error {
		return txlock.WithSemaphore(ctx, admin, key, 3, func(ctx context.Context, tx *sql.Tx) error {
			l, _ := txlock.LockFromContext(ctx)
			return runs.Run(ctx, locktest.SQLTx{Tx: tx}, "w", l.Slot, 5*time.Millisecond)
		}, txlock.WithTimeout(time.Minute))
	})
	require.Empty(t, errs)
	assert.Equal(t, 1, runs.MaxInside(t, admin, "true"), "holders inside at once beside psql's two")
	assert.Equal(t, map[string]int{"2": 16}, runs.Count(t, admin, "slot"))

	fmt.Fprintln(stdin, "COMMIT;\nSELECT 'released';")
	for next() != " released" {
	}
	ok, err = txlock.TryWithSemaphore(ctx, admin, key, 1, func(ctx context.Context, _ *sql.Tx) error {
		l, _ := txlock.LockFromContext(ctx)
		assert.Zero(t, l.Slot)
		return nil
	})
	require.NoError(t, err)
	assert.True(t, ok, "slot 0 once psql let go")
	require.NoError(t, stdin.Close())
}

// Semaphores across processes: the test binary re-executes itself as
// holder processes, which get the server's URL from their environment.
const semChildEnv = "TXLOCK_SEM_CHILD"

func init() {
	if os.Getenv(semChildEnv) != "" {
		os.Exit(semChild())
	}
}

// semChild runs TXLOCK_SEM_WORKERS workers on the semaphore
// TXLOCK_CHILD_KEY of TXLOCK_SEM_N slots, recording each hold in
// TXLOCK_CHILD_TABLE, from a "go" on its stdin until TXLOCK_SEM_FOR has
// passed; then it prints "done".
func semChild() int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "semaphore child %d: %v\n", os.Getpid(), err)
		return 1
	}
	db, err := sql.Open("pgx", os.Getenv("TXLOCK_CHILD_URL"))
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	workers, _ := strconv.Atoi(os.Getenv("TXLOCK_SEM_WORKERS"))
	n, _ := strconv.Atoi(os.Getenv("TXLOCK_SEM_N"))
	d, err := time.ParseDuration(os.Getenv("TXLOCK_SEM_FOR"))
	if err != nil {
		return fail(err)
	}
	db.SetMaxOpenConns(workers)
	key := txlock.StringKey(os.Getenv("TXLOCK_CHILD_KEY"))
	runs := locktest.Runs{Table: os.Getenv("TXLOCK_CHILD_TABLE")}
	who := strconv.Itoa(os.Getpid())
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return fail(err)
	}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				err := txlock.WithSemaphore(context.Background(), db, key, n, func(ctx context.Context, tx *sql.Tx) error {
					l, _ := txlock.LockFromContext(ctx)
					return runs.Run(ctx, locktest.SQLTx{Tx: tx}, who, l.Slot, 5*time.Millisecond)
				}, txlock.WithTimeout(time.Minute))
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return fail(err)
	}
	fmt.Println("done")
	return 0
}

// Five processes of three workers each share a semaphore of 3 slots for
// two seconds: at most 3 inside at once by the server's clock, never two in
// a slot, and every process and every slot gets a fair share.
func TestSemaphoreAcrossProcesses(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			admin := direct(t)
			const procs, workers, n = 5, 3, 3
			runs := locktest.NewRuns(t, admin, "txlock_sem_procs")
			key := uniq(t)
			var starts []func() string
			var stdins []interface{ Write([]byte) (int, error) }
			for range procs {
				cmd := exec.Command(os.Args[0])
				cmd.Env = append(os.Environ(), semChildEnv+"=1", "TXLOCK_CHILD_URL="+childURL(t, via),
					"TXLOCK_CHILD_KEY="+key, "TXLOCK_CHILD_TABLE="+runs.Table,
					"TXLOCK_SEM_WORKERS="+strconv.Itoa(workers), "TXLOCK_SEM_N="+strconv.Itoa(n), "TXLOCK_SEM_FOR=2s")
				cmd.Stderr = os.Stderr
				stdin, next := runChild(t, cmd)
				require.Equal(t, "ready", next())
				starts, stdins = append(starts, next), append(stdins, stdin)
			}
			for _, w := range stdins {
				_, err := w.Write([]byte("go\n"))
				require.NoError(t, err)
			}
			for _, next := range starts {
				require.Equal(t, "done", next())
			}

			assert.Equal(t, n, runs.MaxInside(t, admin, "true"), "holders inside at once")
			assert.Zero(t, runs.SharedSlots(t, admin), "runs that shared a slot")
			total := 0
			perProc := runs.Count(t, admin, "who")
			for _, c := range perProc {
				total += c
			}
			require.Len(t, perProc, procs, "processes that held a slot")
			for p, c := range perProc {
				assert.GreaterOrEqual(t, c, total/procs/4, "runs of process %s, of %v", p, perProc)
			}
			perSlot := runs.Count(t, admin, "slot")
			require.Len(t, perSlot, n, "slots used")
			for s, c := range perSlot {
				assert.GreaterOrEqual(t, c, total/n/4, "runs in slot %s, of %v", s, perSlot)
			}
			t.Logf("%d runs; per process %v; per slot %v", total, perProc, perSlot)
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
