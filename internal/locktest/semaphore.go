package locktest

import (
	"context"
	"database/sql"
	"fmt"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

// Runs records a semaphore's holders: each run of fn writes, in fn's
// transaction, when it entered and left by the server's clock, the slot it
// held, and who ran it. Its table is Table.
type Runs struct {
	Table string
}

// NewRuns creates a Runs table through db, prefixed with prefix, and drops
// it when the test ends.
func NewRuns(t testing.TB, db *sql.DB, prefix string) *Runs {
	t.Helper()
	r := &Runs{Table: fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())}
	_, err := db.Exec(`CREATE TABLE ` + r.Table + ` (id serial PRIMARY KEY, who text NOT NULL, slot int NOT NULL, enter timestamptz NOT NULL, exit timestamptz)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Exec(`DROP TABLE ` + r.Table)
		assert.NoError(t, err)
	})
	return r
}

// Run records one run in tx, which holds slot, inside for hold.
func (r *Runs) Run(ctx context.Context, tx Tx, who string, slot int, hold time.Duration) error {
	id, err := tx.QueryInt(ctx, `INSERT INTO `+r.Table+` (who, slot, enter) VALUES ($1, $2, clock_timestamp()) RETURNING id`, who, slot)
	if err != nil {
		return err
	}
	time.Sleep(hold)
	return tx.Exec(ctx, `UPDATE `+r.Table+` SET exit = clock_timestamp() WHERE id = $1`, id)
}

// MaxInside returns the most runs that were inside at once, among those
// that where (an SQL condition on the table's columns, or "true") selects.
func (r *Runs) MaxInside(t testing.TB, db *sql.DB, where string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`WITH r AS (SELECT * FROM `+r.Table+` WHERE `+where+`)
		SELECT coalesce(max(c), 0) FROM (SELECT (SELECT count(*) FROM r b WHERE b.enter <= a.enter AND b.exit > a.enter) AS c FROM r a) AS x`).Scan(&n))
	return n
}

// SharedSlots counts the pairs of runs that held the same slot at once.
func (r *Runs) SharedSlots(t testing.TB, db *sql.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+r.Table+` a JOIN `+r.Table+` b
		ON a.id < b.id AND a.slot = b.slot AND a.enter < b.exit AND b.enter < a.exit`).Scan(&n))
	return n
}

// Count returns the number of runs by column (who or slot), with a row for
// every value of it that has runs.
func (r *Runs) Count(t testing.TB, db *sql.DB, column string) map[string]int {
	t.Helper()
	rows, err := db.Query(`SELECT ` + column + `::text, count(*) FROM ` + r.Table + ` GROUP BY 1`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		require.NoError(t, rows.Scan(&k, &n))
		out[k] = n
	}
	require.NoError(t, rows.Err())
	return out
}

// SemaphoreFunc is a driver's WithSemaphore, with fn's transaction as a Tx.
type SemaphoreFunc func(ctx context.Context, key txlock.Key, n int, fn func(context.Context, Tx) error, opts ...txlock.Option) error

// TrySemaphoreFunc is a driver's TryWithSemaphore.
type TrySemaphoreFunc func(ctx context.Context, key txlock.Key, n int, fn func(context.Context, Tx) error, opts ...txlock.Option) (bool, error)

// RequireSemaphore checks a driver's WithSemaphore and TryWithSemaphore on
// the server of admin, which must be reached directly: at most n holders
// inside at once by the server's clock, and n reached; never two in one
// slot; every slot used; a holder holds exactly its slot's advisory lock;
// callers with different n share the slots they have in common; and a try
// finds every slot busy when they are.
func RequireSemaphore(t *testing.T, admin *sql.DB, with SemaphoreFunc, try TrySemaphoreFunc) {
	t.Helper()
	ctx := context.Background()
	key := txlock.StringKey(Uniq(t))

	// A holder holds one advisory lock, its slot's, and its context says so.
	err := with(ctx, key, 3, func(ctx context.Context, tx Tx) error {
		l, ok := txlock.LockFromContext(ctx)
		require.True(t, ok)
		assert.Equal(t, 3, l.Slots)
		assert.Equal(t, []txlock.Key{key}, l.Keys)
		require.True(t, l.Slot >= 0 && l.Slot < 3, "slot %d", l.Slot)
		pid, err := tx.QueryInt(ctx, `SELECT pg_catalog.pg_backend_pid()`)
		require.NoError(t, err)
		assert.Equal(t, 1, advisoryLocks(t, admin, pid), "advisory locks of the holder")
		assert.Equal(t, pid, HolderPID(t, admin, txlock.SlotKey(key, l.Slot)), "the holder of slot %d", l.Slot)
		return nil
	}, txlock.WithMaxHold(time.Minute), txlock.WithOwner("semaphore-test"))
	require.NoError(t, err)

	// Exclusion: 12 workers on 3 slots.
	const n, workers, iters = 3, 12, 5
	runs := NewRuns(t, admin, "txlock_sem")
	errs := Hammer(workers, iters, func() error {
		return with(ctx, key, n, func(ctx context.Context, tx Tx) error {
			l, _ := txlock.LockFromContext(ctx)
			return runs.Run(ctx, tx, "w", l.Slot, 10*time.Millisecond)
		}, txlock.WithTimeout(time.Minute))
	})
	require.Empty(t, errs)
	assert.Equal(t, n, runs.MaxInside(t, admin, "true"), "holders inside at once")
	assert.Zero(t, runs.SharedSlots(t, admin), "runs that shared a slot")
	perSlot := runs.Count(t, admin, "slot")
	assert.Len(t, perSlot, n, "slots used: %v", perSlot)
	for s, c := range perSlot {
		assert.GreaterOrEqual(t, c, workers*iters/n/4, "runs in slot %s of %v", s, perSlot)
	}

	// Different n on one key: the callers with n = 2 use slots 0 and 1
	// only, and at most 4 run at once in all.
	mixed := NewRuns(t, admin, "txlock_sem_mixed")
	errs = Hammer(8, 5, func() (err error) {
		for _, m := range []int{2, 4} {
			if err = with(ctx, key, m, func(ctx context.Context, tx Tx) error {
				l, _ := txlock.LockFromContext(ctx)
				return mixed.Run(ctx, tx, "n"+strconv.Itoa(m), l.Slot, 5*time.Millisecond)
			}, txlock.WithTimeout(time.Minute)); err != nil {
				return err
			}
		}
		return nil
	})
	require.Empty(t, errs)
	assert.LessOrEqual(t, mixed.MaxInside(t, admin, "true"), 4)
	assert.LessOrEqual(t, mixed.MaxInside(t, admin, "who = 'n2'"), 2)
	assert.Zero(t, mixed.SharedSlots(t, admin))
	var beyond int
	require.NoError(t, admin.QueryRow(`SELECT count(*) FROM `+mixed.Table+` WHERE who = 'n2' AND slot >= 2`).Scan(&beyond))
	assert.Zero(t, beyond, "runs with n = 2 in slots 2 or 3")

	// A try: every slot busy, then one free.
	var wg sync.WaitGroup
	in, out := make(chan struct{}), make(chan struct{})
	for range 2 {
		wg.Go(func() {
			assert.NoError(t, with(ctx, key, 2, func(context.Context, Tx) error {
				in <- struct{}{}
				<-out
				return nil
			}))
		})
	}
	<-in
	<-in
	ok, err := try(ctx, key, 2, func(context.Context, Tx) error {
		t.Error("fn ran with every slot busy")
		return nil
	})
	require.NoError(t, err)
	assert.False(t, ok)
	ok, err = try(ctx, key, 3, func(ctx context.Context, _ Tx) error {
		l, _ := txlock.LockFromContext(ctx)
		assert.Equal(t, 2, l.Slot, "the one free slot")
		return nil
	})
	require.NoError(t, err)
	assert.True(t, ok)
	close(out)
	wg.Wait()
}

// advisoryLocks counts the advisory locks that backend pid holds.
func advisoryLocks(t testing.TB, db *sql.DB, pid int) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1`, pid).Scan(&n))
	return n
}

// SlotSQL is SlotKey's documented SQL for slot i of a key of either kind.
func SlotSQL(k txlock.Key, i int) string {
	if a, b, ok := k.Pair(); ok {
		return fmt.Sprintf(`('x' || left(encode(sha256('\x02'::bytea || int4send(%d) || int4send(%d) || int4send(%d)), 'hex'), 16))::bit(64)::bigint`, a, b, i)
	}
	v, _ := k.Int64()
	return fmt.Sprintf(`('x' || left(encode(sha256('\x01'::bytea || int8send(%d::bigint) || int4send(%d)), 'hex'), 16))::bit(64)::bigint`, v, i)
}

// SemaphoreByHand has an operator's psql, connected to psqlURL, take two of
// three slots by hand with SlotSQL: a try then finds no slot, and 16 calls
// of with (4 workers) run one at a time in the third slot until psql lets
// go; then slot 0 is free. admin reaches the server directly.
func SemaphoreByHand(t *testing.T, admin *sql.DB, psqlURL string, with SemaphoreFunc, try TrySemaphoreFunc) {
	t.Helper()
	ctx := context.Background()
	key := txlock.StringKey(Uniq(t))
	name, _ := key.Int64()
	psql := exec.Command(pgtest.Psql(t), "-X", "-q", "-v", "ON_ERROR_STOP=1", psqlURL)
	stdin, next := RunChild(t, psql)
	fmt.Fprintf(stdin, "BEGIN;\nSELECT pg_advisory_xact_lock(%s);\nSELECT pg_advisory_xact_lock(%s);\nSELECT 'held';\n",
		SlotSQL(txlock.Int64Key(name), 0), SlotSQL(txlock.Int64Key(name), 1))
	for next() != " held" {
	}

	ok, err := try(ctx, key, 2, func(context.Context, Tx) error {
		t.Error("fn ran while psql held both slots")
		return nil
	})
	require.NoError(t, err)
	assert.False(t, ok)

	runs := NewRuns(t, admin, "txlock_sem_hand")
	errs := Hammer(4, 4, func() error {
		return with(ctx, key, 3, func(ctx context.Context, tx Tx) error {
			l, _ := txlock.LockFromContext(ctx)
			return runs.Run(ctx, tx, "w", l.Slot, 5*time.Millisecond)
		}, txlock.WithTimeout(time.Minute))
	})
	require.Empty(t, errs)
	assert.Equal(t, 1, runs.MaxInside(t, admin, "true"), "holders inside at once beside psql's two")
	assert.Equal(t, map[string]int{"2": 16}, runs.Count(t, admin, "slot"))

	fmt.Fprintln(stdin, "COMMIT;\nSELECT 'released';")
	for next() != " released" {
	}
	ok, err = try(ctx, key, 1, func(ctx context.Context, _ Tx) error {
		l, _ := txlock.LockFromContext(ctx)
		assert.Zero(t, l.Slot)
		return nil
	})
	require.NoError(t, err)
	assert.True(t, ok, "slot 0 once psql let go")
	require.NoError(t, stdin.Close())
}
