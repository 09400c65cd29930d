package sqlxlock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/sqlxlock"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

func open(t *testing.T, url string) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Open("pgx", url)
	require.NoError(t, err)
	t.Cleanup(func() {
		assert.Eventually(t, func() bool { return db.Stats().InUse == 0 }, 5*time.Second, 10*time.Millisecond)
		var n int
		assert.NoError(t, db.Get(&n, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`))
		assert.Zero(t, n, "advisory locks left")
		assert.NoError(t, db.Close())
	})
	return db
}

type counter struct {
	ID int `db:"id"`
	N  int `db:"n"`
}

func TestSqlxMutualExclusion(t *testing.T) {
	for _, via := range []string{"direct", "pgbouncer"} {
		t.Run(via, func(t *testing.T) {
			admin := open(t, pgtest.Postgres(t))
			url := pgtest.Postgres(t)
			if via == "pgbouncer" {
				url, _ = pgtest.PgBouncer(t)
				url += "&default_query_exec_mode=exec"
			}
			db := open(t, url)
			table := fmt.Sprintf("sqlx_counter_%d", time.Now().UnixNano())
			admin.MustExec(`CREATE TABLE ` + table + ` (id int PRIMARY KEY, n int NOT NULL); INSERT INTO ` + table + ` VALUES (1, 0)`)
			t.Cleanup(func() { admin.MustExec(`DROP TABLE ` + table) })
			key := txlock.NewKeyspace("sqlx-test").Key(t.Name())

			var wg sync.WaitGroup
			for range 6 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 5 {
						err := sqlxlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sqlx.Tx) error {
							var c counter
							if err := tx.GetContext(ctx, &c, tx.Rebind(`SELECT id, n FROM `+table+` WHERE id = ?`), 1); err != nil {
								return err
							}
							time.Sleep(time.Millisecond)
							c.N++
							_, err := tx.NamedExecContext(ctx, `UPDATE `+table+` SET n = :n WHERE id = :id`, c)
							return err
						}, txlock.WithTimeout(30*time.Second))
						assert.NoError(t, err)
					}
				}()
			}
			wg.Wait()
			var n int
			require.NoError(t, admin.Get(&n, `SELECT n FROM `+table+` WHERE id = 1`))
			assert.Equal(t, 30, n)
		})
	}
}

// heldKey opens a pool and takes the test's key in a transaction of its
// own, with sqlxlock.TryLockTx.
func heldKey(t *testing.T) (db *sqlx.DB, key txlock.Key, holder *sqlx.Tx) {
	t.Helper()
	db = open(t, pgtest.Postgres(t))
	key = txlock.StringKey(t.Name())
	holder, err := db.BeginTxx(context.Background(), nil)
	require.NoError(t, err)
	ok, err := sqlxlock.TryLockTx(context.Background(), holder, key)
	require.NoError(t, err)
	require.True(t, ok)
	return db, key, holder
}

func TestSqlxTryAndLockTx(t *testing.T) {
	db, key, holder := heldKey(t)

	called := false
	ok, err := sqlxlock.TryWithLock(context.Background(), db, key, func(context.Context, *sqlx.Tx) error { called = true; return nil })
	require.NoError(t, err)
	assert.False(t, ok)
	assert.False(t, called)

	ok, err = sqlxlock.TryWithLocks(context.Background(), db, []txlock.Key{txlock.StringKey("other"), key}, func(context.Context, *sqlx.Tx) error { return nil })
	require.NoError(t, err)
	assert.False(t, ok)

	err = sqlxlock.WithLock(context.Background(), db, key, func(context.Context, *sqlx.Tx) error { return nil }, txlock.WithTimeout(100*time.Millisecond))
	assert.ErrorIs(t, err, txlock.ErrLockTimeout)

	time.AfterFunc(100*time.Millisecond, func() { _ = holder.Rollback() })
	sentinel := errors.New("from fn")
	err = sqlxlock.WithLocks(context.Background(), db, []txlock.Key{key}, func(ctx context.Context, tx *sqlx.Tx) error {
		assert.True(t, txlock.Held(ctx))
		return sentinel
	})
	assert.ErrorIs(t, err, sentinel)

	tx, err := db.BeginTxx(context.Background(), nil)
	require.NoError(t, err)
	require.NoError(t, sqlxlock.LockTx(context.Background(), tx, key))
	require.NoError(t, tx.Rollback())
}

func TestSqlxBadInput(t *testing.T) {
	var nilDB *sqlx.DB
	err := sqlxlock.WithLock(context.Background(), nilDB, txlock.StringKey("k"), func(context.Context, *sqlx.Tx) error { return nil })
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	err = sqlxlock.WithLock(context.Background(), nil, txlock.StringKey("k"), func(context.Context, *sqlx.Tx) error { return nil })
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	db, err := sqlx.Open("pgx", "postgres://x@127.0.0.1:1/x")
	require.NoError(t, err)
	defer db.Close()
	err = sqlxlock.WithLock(context.Background(), db, txlock.StringKey("k"), nil)
	assert.ErrorContains(t, err, "fn is nil")
	err = sqlxlock.LockTx(context.Background(), nil, txlock.StringKey("k"))
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	_, err = sqlxlock.TryLockTx(context.Background(), nil, txlock.StringKey("k"))
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
}

// Fencing tokens are drawn through a *sqlx.DB, and fenced writes run on a
// *sqlx.Tx.
func TestSqlxFencing(t *testing.T) {
	db := open(t, pgtest.Postgres(t))
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, db))
	table := fmt.Sprintf("sqlx_fenced_%d", time.Now().UnixNano())
	db.MustExec(`CREATE TABLE ` + table + ` (id int PRIMARY KEY, v text, fence_token bigint NOT NULL DEFAULT 0)`)
	t.Cleanup(func() { db.MustExec(`DROP TABLE ` + table) })
	ft := txlock.FencedTable{Name: table}

	var tokens []int64
	for range 2 {
		require.NoError(t, sqlxlock.WithLock(ctx, db, txlock.StringKey(t.Name()), func(ctx context.Context, tx *sqlx.Tx) error {
			tok, err := txlock.FenceToken(ctx)
			if err != nil {
				return err
			}
			tokens = append(tokens, tok)
			return ft.Upsert(ctx, tx, tok, []txlock.Col{{Name: "id", Value: 1}}, []txlock.Col{{Name: "v", Value: fmt.Sprint(tok)}})
		}))
	}
	require.Len(t, tokens, 2)
	assert.Greater(t, tokens[1], tokens[0])
	err := ft.Upsert(ctx, db, tokens[0], []txlock.Col{{Name: "id", Value: 1}}, []txlock.Col{{Name: "v", Value: "stale"}})
	assert.ErrorIs(t, err, txlock.ErrStaleToken)
	var v string
	require.NoError(t, db.Get(&v, `SELECT v FROM `+table+` WHERE id = 1`))
	assert.Equal(t, fmt.Sprint(tokens[1]), v)
}

// sqlx calls queue locally like database/sql ones, and with them: callers
// on the same pool that wait for the same key form one queue, whose head
// alone polls, whether they come through sqlxlock, or give txlock the
// *sqlx.DB or its *sql.DB.
func TestSqlxLocalQueue(t *testing.T) {
	db, key, holder := heldKey(t)

	const callers = 8
	attempts := make(chan int, callers)
	record := func(ctx context.Context) {
		lock, _ := txlock.LockFromContext(ctx)
		attempts <- lock.Attempts
	}
	opts := []txlock.Option{txlock.WithRetry(txlock.ConstantBackoff{Interval: 5 * time.Millisecond}), txlock.WithTimeout(20 * time.Second)}
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			switch i % 3 {
			case 0:
				assert.NoError(t, sqlxlock.WithLock(context.Background(), db, key, func(ctx context.Context, _ *sqlx.Tx) error {
					record(ctx)
					return nil
				}, opts...))
			case 1: // txlock itself, given the *sqlx.DB
				assert.NoError(t, txlock.WithLock(context.Background(), db, key, func(ctx context.Context, _ *sql.Tx) error {
					record(ctx)
					return nil
				}, opts...))
			default:
				assert.NoError(t, txlock.WithLock(context.Background(), db.DB, key, func(ctx context.Context, _ *sql.Tx) error {
					record(ctx)
					return nil
				}, opts...))
			}
		}()
	}
	time.Sleep(300 * time.Millisecond) // about 60 polls' worth
	require.NoError(t, holder.Rollback())
	wg.Wait()
	close(attempts)
	// The head polls about 60 times. A caller that arrives just as the
	// queue empties, while another caller's first attempt (which takes no
	// turn) holds the lock, polls a few times as the new head; a caller
	// that polled on its own, outside the queue, would show dozens.
	var polled []int
	for n := range attempts {
		if n > 5 {
			polled = append(polled, n)
		}
	}
	assert.LessOrEqual(t, len(polled), 1, "only the head of the queue polls, sqlx or not: %v", polled)
}
