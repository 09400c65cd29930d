package txlock_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// stockTable creates a fenced stock table holding SKU-1001 with quantity 50,
// and the default fencing sequence.
func stockTable(t *testing.T, db *sql.DB) txlock.FencedTable {
	t.Helper()
	name := fmt.Sprintf("stock_%d", time.Now().UnixNano())
	_, err := db.Exec(`CREATE TABLE ` + name + ` (sku text PRIMARY KEY, qty int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO ` + name + ` (sku, qty) VALUES ('SKU-1001', 50)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + name) })
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), db))
	return txlock.FencedTable{Name: name}
}

func readStock(t *testing.T, db *sql.DB, ft txlock.FencedTable) (qty int, token int64) {
	t.Helper()
	require.NoError(t, db.QueryRow(`SELECT qty, fence_token FROM `+ft.Name+` WHERE sku = 'SKU-1001'`).Scan(&qty, &token))
	return qty, token
}

func TestFencedSeedScenario(t *testing.T) {
	db := direct(t)
	ft := stockTable(t, db)
	ctx := context.Background()
	sku := []txlock.Col{{Name: "sku", Value: "SKU-1001"}}

	n, err := ft.Update(ctx, db, 2, []txlock.Col{{Name: "qty", Value: 42}}, sku)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)

	// The paused holder A wakes up with token 1.
	_, err = ft.Update(ctx, db, 1, []txlock.Col{{Name: "qty", Value: 49}}, sku)
	require.ErrorIs(t, err, txlock.ErrStaleToken)
	var stale *txlock.StaleTokenError
	require.ErrorAs(t, err, &stale)
	assert.EqualValues(t, 1, stale.Token)
	assert.EqualValues(t, 2, stale.Current)
	assert.Contains(t, err.Error(), "holds token 2, the write carried 1")

	qty, token := readStock(t, db, ft)
	assert.Equal(t, 42, qty)
	assert.EqualValues(t, 2, token)

	// A holder may write again with its own token.
	_, err = ft.Update(ctx, db, 2, []txlock.Col{{Name: "qty", Value: 41}}, sku)
	require.NoError(t, err)
	qty, _ = readStock(t, db, ft)
	assert.Equal(t, 41, qty)
}

func TestFencedPaths(t *testing.T) {
	db := direct(t)
	ft := stockTable(t, db)
	ctx := context.Background()
	sku := func(s string) []txlock.Col { return []txlock.Col{{Name: "sku", Value: s}} }
	qty := func(n int) []txlock.Col { return []txlock.Col{{Name: "qty", Value: n}} }

	_, err := ft.Update(ctx, db, 5, qty(1), sku("SKU-404"))
	assert.ErrorIs(t, err, txlock.ErrRowNotFound)
	assert.NotErrorIs(t, err, txlock.ErrStaleToken)

	// Upsert: insert, update with a larger token, refuse a smaller one.
	require.NoError(t, ft.Upsert(ctx, db, 3, sku("SKU-2002"), qty(7)))
	require.NoError(t, ft.Upsert(ctx, db, 4, sku("SKU-2002"), qty(8)))
	err = ft.Upsert(ctx, db, 3, sku("SKU-2002"), qty(9))
	var stale *txlock.StaleTokenError
	require.ErrorAs(t, err, &stale)
	assert.EqualValues(t, 4, stale.Current)
	var q int
	var tok int64
	require.NoError(t, db.QueryRow(`SELECT qty, fence_token FROM `+ft.Name+` WHERE sku = 'SKU-2002'`).Scan(&q, &tok))
	assert.Equal(t, 8, q)
	assert.EqualValues(t, 4, tok)

	// Delete: refused with a smaller token, done with an equal one, then gone.
	_, err = ft.Delete(ctx, db, 3, sku("SKU-2002"))
	assert.ErrorIs(t, err, txlock.ErrStaleToken)
	n, err := ft.Delete(ctx, db, 4, sku("SKU-2002"))
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	_, err = ft.Delete(ctx, db, 4, sku("SKU-2002"))
	assert.ErrorIs(t, err, txlock.ErrRowNotFound)

	// Inside a transaction, and with a schema-qualified table.
	tx, err := db.Begin()
	require.NoError(t, err)
	_, err = txlock.FencedTable{Schema: "public", Name: ft.Name}.Update(ctx, tx, 9, qty(1), sku("SKU-1001"))
	require.NoError(t, err)
	require.NoError(t, tx.Rollback())
	qv, tv := readStock(t, db, ft)
	assert.Equal(t, 50, qv)
	assert.Zero(t, tv)

	// A NULL token counts as never fenced.
	_, err = db.Exec(`ALTER TABLE ` + ft.Name + ` ALTER fence_token DROP NOT NULL; UPDATE ` + ft.Name + ` SET fence_token = NULL`)
	require.NoError(t, err)
	_, err = ft.Update(ctx, db, 1, qty(2), sku("SKU-1001"))
	require.NoError(t, err)
}

func TestFencedIdentifiers(t *testing.T) {
	db := direct(t)
	ctx := context.Background()
	_, err := db.Exec(`CREATE TABLE IF NOT EXISTS fenced_victim (id int); CREATE TABLE IF NOT EXISTS "we""ird tbl" ("sk""u" text PRIMARY KEY, "q ty" int, "fence;tok" bigint)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE IF EXISTS "we""ird tbl"`) })

	// Odd but legal identifiers are quoted, not broken.
	weird := txlock.FencedTable{Name: `we"ird tbl`, FenceColumn: "fence;tok"}
	require.NoError(t, weird.Upsert(ctx, db, 1, []txlock.Col{{Name: `sk"u`, Value: "a"}}, []txlock.Col{{Name: "q ty", Value: 1}}))
	_, err = weird.Update(ctx, db, 2, []txlock.Col{{Name: "q ty", Value: 2}}, []txlock.Col{{Name: `sk"u`, Value: "a"}})
	require.NoError(t, err)

	// Hostile identifiers name things that do not exist, and harm nothing.
	hostile := `x"; DROP TABLE fenced_victim; --`
	for _, tc := range []func() error{
		func() error {
			_, err := txlock.FencedTable{Name: hostile}.Update(ctx, db, 1, []txlock.Col{{Name: "a", Value: 1}}, []txlock.Col{{Name: "b", Value: 1}})
			return err
		},
		func() error {
			_, err := txlock.FencedTable{Schema: hostile, Name: "t"}.Delete(ctx, db, 1, []txlock.Col{{Name: "b", Value: 1}})
			return err
		},
		func() error {
			_, err := weird.Update(ctx, db, 3, []txlock.Col{{Name: hostile, Value: 1}}, []txlock.Col{{Name: `sk"u`, Value: "a"}})
			return err
		},
		func() error {
			return txlock.FencedTable{Name: `we"ird tbl`, FenceColumn: hostile}.Upsert(ctx, db, 3, []txlock.Col{{Name: `sk"u`, Value: "a"}}, nil)
		},
	} {
		err := tc()
		require.Error(t, err)
		code := txlock.SQLState(err)
		assert.Contains(t, []string{"42P01", "42703", "3F000", ""}, code, "%v", err)
	}
	// A hostile sequence name is just an odd name.
	require.NoError(t, txlock.Fencer{Sequence: `s'); DROP TABLE fenced_victim; --`}.CreateSequence(ctx, db))
	_, err = db.Exec(`DROP SEQUENCE "s'); DROP TABLE fenced_victim; --"`)
	require.NoError(t, err)
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM fenced_victim`).Scan(&n), "the victim table must survive")
}

func TestFencedBadInput(t *testing.T) {
	db := direct(t)
	ctx := context.Background()
	ft := txlock.FencedTable{Name: "stock"}
	set := []txlock.Col{{Name: "qty", Value: 1}}
	where := []txlock.Col{{Name: "sku", Value: "a"}}
	for _, tc := range []struct {
		name string
		err  error
		msg  string
	}{
		{"empty set", second(ft.Update(ctx, db, 1, nil, where)), "no columns to set"},
		{"empty where", second(ft.Update(ctx, db, 1, set, nil)), "no columns to match"},
		{"empty delete where", second(ft.Delete(ctx, db, 1, nil)), "no columns to match"},
		{"empty upsert key", ft.Upsert(ctx, db, 1, nil, set), "no columns to match"},
		{"zero token", second(ft.Update(ctx, db, 0, set, where)), "token must be positive, got 0"},
		{"negative token", ft.Upsert(ctx, db, -5, where, set), "token must be positive, got -5"},
		{"empty table", second(txlock.FencedTable{}.Update(ctx, db, 1, set, where)), "FencedTable name is empty"},
		{"NUL in column", second(ft.Update(ctx, db, 1, []txlock.Col{{Name: "q\x00", Value: 1}}, where)), "NUL"},
		{"bad UTF-8 schema", second(txlock.FencedTable{Schema: "\xff", Name: "t"}.Delete(ctx, db, 1, where)), "UTF-8"},
		{"identifier too long", second(ft.Update(ctx, db, 1, []txlock.Col{{Name: strings.Repeat("c", 64), Value: 1}}, where)), "63 bytes"},
		{"fence column in set", second(ft.Update(ctx, db, 1, []txlock.Col{{Name: "fence_token", Value: 9}}, where)), "fence column"},
		{"duplicate column", second(ft.Update(ctx, db, 1, set, []txlock.Col{{Name: "qty", Value: 2}})), "appears twice"},
		{"nil querier", second(ft.Update(ctx, nil, 1, set, where)), "q is nil"},
		{"bad sequence name", txlock.Fencer{Sequence: strings.Repeat("s", 70)}.CreateSequence(ctx, db), "63 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.ErrorIs(t, tc.err, txlock.ErrInvalidArgument)
			assert.ErrorContains(t, tc.err, tc.msg)
		})
	}
}

func second[T any](_ T, err error) error { return err }

func TestFenceTokenRules(t *testing.T) {
	db := direct(t)
	stockTable(t, db) // creates the sequence
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))

	_, err := txlock.FenceToken(ctx)
	assert.ErrorIs(t, err, txlock.ErrNoToken, "outside fn")

	var t1, t2 int64
	require.NoError(t, txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		t1, err = txlock.FenceToken(ctx)
		require.NoError(t, err)
		t2, err = txlock.FenceToken(ctx)
		require.NoError(t, err)
		return nil
	}))
	assert.Positive(t, t1)
	assert.Equal(t, t1, t2, "one token per holder")

	// The next holder gets a larger one, even if the first holder's fn failed.
	var t3 int64
	_ = txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		t3, _ = txlock.FenceToken(ctx)
		return errors.New("fn failed")
	})
	var t4 int64
	require.NoError(t, txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		t4, err = txlock.FenceToken(ctx)
		return err
	}))
	assert.Greater(t, t3, t1)
	assert.Greater(t, t4, t3)

	// Fail-open: fn runs without the lock, so it gets no token.
	hold(t, db, key, false)
	require.NoError(t, txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		_, err := txlock.FenceToken(ctx)
		assert.ErrorIs(t, err, txlock.ErrNoToken)
		assert.ErrorContains(t, err, "fail-open")
		return nil
	}, txlock.WithTimeout(50*time.Millisecond), txlock.WithFailOpen(nil)))

	// A single connection cannot draw a token beside the lock: a clear
	// error, not a deadlock.
	other := txlock.StringKey(uniq(t))
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, txlock.WithLock(ctx, conn, other, func(ctx context.Context, tx *sql.Tx) error {
		_, err := txlock.FenceToken(ctx)
		assert.ErrorIs(t, err, txlock.ErrNoToken)
		assert.ErrorContains(t, err, "*sql.Conn")
		return nil
	}))
	one := open(t, pgtest.Postgres(t))
	one.SetMaxOpenConns(1)
	require.NoError(t, txlock.WithLock(ctx, one, other, func(ctx context.Context, tx *sql.Tx) error {
		_, err := txlock.FenceToken(ctx)
		assert.ErrorIs(t, err, txlock.ErrNoToken)
		assert.ErrorContains(t, err, "SetMaxOpenConns(1)")
		return nil
	}))

	// A missing sequence is reported as such.
	require.NoError(t, txlock.WithLock(ctx, db, other, func(ctx context.Context, tx *sql.Tx) error {
		_, err := txlock.Fencer{Sequence: "no_such_seq"}.Token(ctx)
		assert.Equal(t, "42P01", txlock.SQLState(err), "%v", err)
		return nil
	}))
}

// The holder's backend dies; asking for a token afterwards fails and
// returns no number.
func TestFenceTokenDeadLockTx(t *testing.T) {
	db := direct(t)
	stockTable(t, db)
	key := txlock.StringKey(uniq(t))
	var token int64
	var tokenErr error
	err := txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		var pid int
		require.NoError(t, tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid))
		var ok bool
		require.NoError(t, db.QueryRowContext(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
		require.True(t, ok)
		require.Eventually(t, func() bool { return heldBy(t, db, key) == 0 }, 5*time.Second, 10*time.Millisecond)
		token, tokenErr = txlock.FenceToken(ctx)
		return nil
	})
	require.Error(t, err, "the commit of a terminated transaction fails")
	assert.ErrorIs(t, tokenErr, txlock.ErrNoToken)
	assert.Zero(t, token)
}

// Tokens increase in lock-acquisition order on every key.
func TestFenceTokensFollowLockOrder(t *testing.T) {
	db := direct(t)
	stockTable(t, db)
	log := fmt.Sprintf("fence_log_%d", time.Now().UnixNano())
	_, err := db.Exec(`CREATE TABLE ` + log + ` (key int, token bigint, at timestamptz)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + log) })
	ks := txlock.NewKeyspace(uniq(t))

	errs := hammer(8, 12, func() error {
		k := int32(time.Now().UnixNano() % 3)
		return txlock.WithLock(context.Background(), db, ks.ID(k), func(ctx context.Context, tx *sql.Tx) error {
			tok, err := txlock.FenceToken(ctx)
			if err != nil {
				return err
			}
			_, err = tx.ExecContext(ctx, `INSERT INTO `+log+` VALUES ($1, $2, clock_timestamp())`, k, tok)
			return err
		}, txlock.WithTimeout(30*time.Second))
	})
	require.Empty(t, errs)
	rows, err := db.Query(`SELECT key, token FROM ` + log + ` ORDER BY key, at`)
	require.NoError(t, err)
	defer rows.Close()
	last := map[int]int64{}
	total := 0
	for rows.Next() {
		var k int
		var tok int64
		require.NoError(t, rows.Scan(&k, &tok))
		assert.Greater(t, tok, last[k], "key %d: token %d after %d", k, tok, last[k])
		last[k] = tok
		total++
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, 96, total)
}

// A token drawn by fn survives a crash of the server before fn commits: the
// next token is larger. A dedicated cluster, since it is crashed.
func TestFenceTokenSurvivesCrash(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	db, err := sql.Open("pgx", c.URL())
	require.NoError(t, err)
	defer db.Close()
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, db))

	for round := range 3 {
		drawn := make(chan int64, 1)
		done := make(chan error, 1)
		go func() {
			done <- txlock.WithLock(ctx, db, txlock.StringKey("crash"), func(ctx context.Context, tx *sql.Tx) error {
				tok, err := txlock.FenceToken(ctx)
				if err != nil {
					return err
				}
				drawn <- tok
				for { // until the crash ends the transaction
					if _, err := tx.ExecContext(ctx, "SELECT 1"); err != nil {
						return err
					}
					time.Sleep(10 * time.Millisecond)
				}
			}, txlock.WithMaxHold(30*time.Second))
		}()
		var t1 int64
		select {
		case t1 = <-drawn:
		case err := <-done:
			t.Fatalf("round %d: %v", round, err)
		}
		require.NoError(t, c.Stop("immediate"))
		require.NoError(t, c.Start())
		db.SetMaxIdleConns(0) // drop connections to the dead server
		db.SetMaxIdleConns(2)
		var t2 int64
		require.Eventually(t, func() bool {
			return txlock.WithLock(ctx, db, txlock.StringKey("after"), func(ctx context.Context, tx *sql.Tx) error {
				var err error
				t2, err = txlock.FenceToken(ctx)
				return err
			}) == nil
		}, 10*time.Second, 50*time.Millisecond)
		assert.Greater(t, t2, t1, "round %d: a token was re-issued after the crash", round)
		t.Logf("round %d: token %d drawn before the crash, %d after", round, t1, t2)
		select {
		case <-done:
		case <-time.After(40 * time.Second):
			t.Fatal("the crashed holder never returned")
		}
	}
}

// The paused-holder timeline, with a real process frozen by SIGSTOP.
func TestFencedPausedHolder(t *testing.T) {
	db := direct(t)
	ft := stockTable(t, db)
	key := txlock.StringKey(uniq(t))

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(),
		fenceChildEnv+"=1",
		"TXLOCK_CHILD_URL="+pgtest.Postgres(t),
		"TXLOCK_CHILD_KEY="+key.Name(),
		"TXLOCK_CHILD_TABLE="+ft.Name,
	)
	cmd.Stderr = os.Stderr
	stdin, next := locktest.RunChild(t, cmd)

	// 1. A acquires with a 1s hold bound, takes its token, and is frozen.
	line := next()
	require.True(t, strings.HasPrefix(line, "token "), line)
	tokenA, err := strconv.ParseInt(strings.TrimPrefix(line, "token "), 10, 64)
	require.NoError(t, err)
	require.Equal(t, 1, heldBy(t, db, key))
	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	frozen := time.Now()

	// 2-3. The server ends A's session at the hold bound; B acquires, gets a
	// larger token and writes.
	var tokenB int64
	require.NoError(t, txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
		t.Logf("B acquired %v after A froze", time.Since(frozen).Round(time.Millisecond))
		var err error
		tokenB, err = txlock.FenceToken(ctx)
		require.NoError(t, err)
		_, err = ft.Update(ctx, db, tokenB, []txlock.Col{{Name: "qty", Value: 42}}, []txlock.Col{{Name: "sku", Value: "SKU-1001"}})
		return err
	}, txlock.WithTimeout(10*time.Second)))
	assert.Less(t, time.Since(frozen), 3*time.Second, "the lock should be released within the hold bound plus a second")
	assert.Greater(t, tokenB, tokenA)

	// 4. A resumes; its fenced write is refused.
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	_, err = fmt.Fprintln(stdin, "write")
	require.NoError(t, err)
	line = next()
	assert.Equal(t, fmt.Sprintf("stale current=%d", tokenB), line)

	// 5. B's data is intact.
	qty, tok := readStock(t, db, ft)
	assert.Equal(t, 42, qty)
	assert.Equal(t, tokenB, tok)
	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait())
}

const fenceChildEnv = "TXLOCK_FENCE_CHILD"

// fenceChild is holder A of TestFencedPausedHolder, in its own process.
func fenceChild() int {
	db, err := sql.Open("pgx", os.Getenv("TXLOCK_CHILD_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	ft := txlock.FencedTable{Name: os.Getenv("TXLOCK_CHILD_TABLE")}
	in := bufio.NewScanner(os.Stdin)
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	err = txlock.WithLock(context.Background(), db, txlock.StringKey(os.Getenv("TXLOCK_CHILD_KEY")), func(ctx context.Context, tx *sql.Tx) error {
		token, err := txlock.FenceToken(ctx)
		if err != nil {
			return err
		}
		say("token %d", token)
		if !in.Scan() { // frozen here; then told to write
			return errors.New("no instruction")
		}
		// The write goes to the resource, not through the (lost) lock tx.
		_, err = ft.Update(context.Background(), db, token, []txlock.Col{{Name: "qty", Value: 49}}, []txlock.Col{{Name: "sku", Value: "SKU-1001"}})
		var stale *txlock.StaleTokenError
		switch {
		case errors.As(err, &stale):
			say("stale current=%d", stale.Current)
		case err != nil:
			say("error %v", err)
		default:
			say("written")
		}
		return nil
	}, txlock.WithMaxHold(time.Second))
	if err == nil {
		fmt.Fprintln(os.Stderr, "holder A committed, but its lock should have been lost")
	}
	return 0
}

func TestFenceMigrationFile(t *testing.T) {
	db := direct(t)
	ddl, err := os.ReadFile("migrations/0001_txlock_fence_seq.sql")
	require.NoError(t, err)
	for range 2 { // idempotent
		_, err = db.Exec(string(ddl))
		require.NoError(t, err)
	}
	var cache int64
	require.NoError(t, db.QueryRow(`SELECT cache_size FROM pg_sequences WHERE schemaname = $1 AND sequencename = $2`,
		txlock.DefaultFenceSchema, txlock.DefaultFenceSequence).Scan(&cache), "the migration creates the zero Fencer's sequence")
	assert.EqualValues(t, 1, cache)

	// A Fencer in another schema creates its own sequence.
	_, err = db.Exec(`CREATE SCHEMA IF NOT EXISTS fencing`)
	require.NoError(t, err)
	f := txlock.Fencer{Schema: "fencing", Sequence: "tokens"}
	require.NoError(t, f.CreateSequence(context.Background(), db))
	require.NoError(t, f.CreateSequence(context.Background(), db))

	// A sequence made by hand with a per-session cache is refused.
	_, err = db.Exec(`CREATE SEQUENCE IF NOT EXISTS fencing.cached CACHE 20`)
	require.NoError(t, err)
	err = txlock.Fencer{Schema: "fencing", Sequence: "cached"}.CreateSequence(context.Background(), db)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "CACHE above 1")
	require.NoError(t, txlock.WithLock(context.Background(), db, txlock.StringKey(uniq(t)), func(ctx context.Context, tx *sql.Tx) error {
		tok, err := f.Token(ctx)
		assert.Positive(t, tok)
		return err
	}))
}

// FuzzQuoteIdent: whatever the name, the quoted identifier names exactly
// that column on the server; it never escapes the identifier.
func FuzzQuoteIdent(f *testing.F) {
	for _, s := range []string{"a", `x"; DROP TABLE t; --`, `"`, `""`, "é", "a b", "x'y", `\`, "SELECT", strings.Repeat("z", 63)} {
		f.Add(s)
	}
	db := direct(f)
	f.Fuzz(func(t *testing.T, name string) {
		q, err := txlock.QuoteIdent("column", name)
		if err != nil {
			require.ErrorIs(t, err, txlock.ErrInvalidArgument)
			return
		}
		rows, err := db.Query(`SELECT 1 AS ` + q)
		require.NoError(t, err, "quoted %q", q)
		defer rows.Close()
		cols, err := rows.Columns()
		require.NoError(t, err)
		require.Equal(t, []string{name}, cols)
	})
}

// The hazard the design avoids, shown on the server: a nextval drawn inside
// a transaction that never commits can be handed out again after a crash,
// because sequences pre-log values in WAL that only a later commit flushes.
// Whether it happens depends on background WAL flushes, so this only logs.
func TestNaiveTokenHazard(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	db, err := sql.Open("pgx", c.URL())
	require.NoError(t, err)
	defer db.Close()
	_, err = db.Exec(`CREATE SEQUENCE naive`)
	require.NoError(t, err)
	tx, err := db.Begin()
	require.NoError(t, err)
	var first int64
	require.NoError(t, tx.QueryRow(`SELECT nextval('naive')`).Scan(&first))
	require.NoError(t, c.Stop("immediate"))
	_ = tx.Rollback()
	require.NoError(t, c.Start())
	db.SetMaxIdleConns(0)
	var again int64
	require.Eventually(t, func() bool { return db.QueryRow(`SELECT nextval('naive')`).Scan(&again) == nil }, 10*time.Second, 50*time.Millisecond)
	t.Logf("uncommitted nextval %d before the crash, %d after (re-issued: %v)", first, again, again <= first)
}

// TestTokenCommitWaits: no draw returns a token before its commit is
// durable where synchronous_standby_names says. With a standby named that
// never connects, every commit that writes WAL waits; nextval writes WAL
// only once per 32 values, and a transaction that wrote none before its
// commit record does not wait, so without a WAL record of its own the
// draws after the first returned at once, their sequence state on no
// standby (on a Patroni cut-off, a failover then handed the same tokens
// out again: reliability/ha_test.go). Each draw must time out instead, with
// WithFencing and without, and its call return at its bound (WithMaxHold
// 300ms, given 3s here): WithFencing's call used to wait for the draw's own
// timeout (10s) before it returned. Once the setting is cleared, draws
// return again.
func TestTokenCommitWaits(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	db := open(t, c.URL())
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, db))
	setStandbys := func(names string) {
		_, err := db.Exec(`ALTER SYSTEM SET synchronous_standby_names = '` + names + `'`)
		require.NoError(t, err)
		_, err = db.Exec(`SELECT pg_reload_conf()`)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			var got string
			return db.QueryRow(`SHOW synchronous_standby_names`).Scan(&got) == nil && got == names
		}, 10*time.Second, 20*time.Millisecond)
	}
	setStandbys("txlock_absent")
	key := txlock.StringKey(uniq(t))
	draw := func(opts ...txlock.Option) (int64, error) {
		var token int64
		err := txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
			var err error
			token, err = txlock.FenceToken(ctx)
			return err
		}, append(opts, txlock.WithMaxHold(300*time.Millisecond))...)
		return token, err
	}
	for _, fencing := range []bool{false, true} {
		var opts []txlock.Option
		if fencing {
			opts = append(opts, txlock.WithFencing())
		}
		for i := range 3 {
			t0 := time.Now()
			token, err := draw(opts...)
			elapsed := time.Since(t0)
			assert.Less(t, elapsed, 3*time.Second, "draw %d (WithFencing %v) returned long after its bound", i, fencing)
			assert.Error(t, err, "draw %d (WithFencing %v) returned token %d with no standby to have it", i, fencing, token)
			assert.ErrorIs(t, err, txlock.ErrHoldTimeout, "draw %d (WithFencing %v)", i, fencing)
		}
	}
	setStandbys("")
	token, err := draw()
	require.NoError(t, err)
	assert.Positive(t, token)
}

// connWrapper hides a single *sql.Conn behind a type the package cannot
// recognise, as an application's wrapper might.
type connWrapper struct{ *sql.Conn }

// A token drawn on the lock's own session would be part of the uncommitted
// lock transaction: refused. And a fn's context outlives fn: neither Held
// nor a token may be had from it afterwards.
func TestFenceTokenSessionAndAfterFn(t *testing.T) {
	db := direct(t)
	stockTable(t, db)
	ctx := context.Background()
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	key := txlock.StringKey(uniq(t))
	require.NoError(t, txlock.WithLock(ctx, connWrapper{conn}, key, func(ctx context.Context, tx *sql.Tx) error {
		_, err := txlock.FenceToken(ctx)
		assert.ErrorIs(t, err, txlock.ErrNoToken)
		assert.ErrorContains(t, err, "lock's own connection")
		return nil
	}))

	var kept context.Context
	require.NoError(t, txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
		kept = ctx
		assert.True(t, txlock.Held(ctx))
		_, err := txlock.FenceToken(ctx)
		return err
	}))
	assert.False(t, txlock.Held(kept), "the lock is gone once fn has returned")
	_, err = txlock.FenceToken(kept)
	assert.ErrorIs(t, err, txlock.ErrNoToken)
}
