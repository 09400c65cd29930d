// Package locktest holds the helpers that the test suites of the library
// and its adapter modules share: a pool that checks it leaks no connection,
// names unique to a test, and a key held from another connection.
package locktest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the driver the tests use
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

// WithParam returns the connection URL u with its query parameter k set to
// v: a startup parameter such as application_name, or a driver's setting.
func WithParam(t testing.TB, u, k, v string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	q := p.Query()
	q.Set(k, v)
	p.RawQuery = q.Encode()
	return p.String()
}

// Open opens a pool of at most maxOpen connections on url, and checks when
// the test ends that none of them is left in use.
func Open(t testing.TB, url string, maxOpen int) *sql.DB {
	t.Helper()
	db, err := sql.Open("pgx", url)
	require.NoError(t, err)
	db.SetMaxOpenConns(maxOpen)
	t.Cleanup(func() {
		require.Eventually(t, func() bool { return db.Stats().InUse == 0 }, 5*time.Second, 10*time.Millisecond,
			"connections still in use: %+v", db.Stats())
		require.NoError(t, db.Close())
	})
	return db
}

// Uniq returns a string unique to this test run.
func Uniq(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return t.Name() + "/" + hex.EncodeToString(b[:])
}

// LockArgs renders k as advisory lock function arguments, from the key's
// own Int64 or Pair but independently of the package's rendering. The
// literals are quoted: -9223372036854775808::int8 is the negation of a
// bigint that does not fit, and fails, as does -2147483648::int4.
func LockArgs(k txlock.Key) string {
	if n, ok := k.Int64(); ok {
		return fmt.Sprintf("'%d'::int8", n)
	}
	a, b, _ := k.Pair()
	return fmt.Sprintf("'%d'::int4, '%d'::int4", a, b)
}

// Hold takes k on its own connection of db, with the blocking
// pg_advisory_xact_lock (shared if asked), and returns the function that
// releases it, which the test's cleanup also runs.
func Hold(t testing.TB, db *sql.DB, k txlock.Key, shared bool) (release func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	fn := "pg_advisory_xact_lock"
	if shared {
		fn += "_shared"
	}
	_, err = tx.ExecContext(ctx, "SELECT "+fn+"("+LockArgs(k)+")")
	require.NoError(t, err)
	// release may run on a timer's goroutine, and again at cleanup.
	var once sync.Once
	release = func() {
		once.Do(func() { assert.NoError(t, tx.Rollback()) })
	}
	t.Cleanup(release)
	return release
}

// HeldBy returns how many backends of db's database hold k (granted).
func HeldBy(t testing.TB, db *sql.DB, k txlock.Key) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM pg_locks WHERE `+granted, grantedArgs(k)...).Scan(&n))
	return n
}

// HolderPID returns the pid of the backend that holds k, or 0.
func HolderPID(t testing.TB, db *sql.DB, k txlock.Key) int {
	t.Helper()
	var pid int
	err := db.QueryRow(`SELECT pid FROM pg_locks WHERE `+granted, grantedArgs(k)...).Scan(&pid)
	if errors.Is(err, sql.ErrNoRows) {
		return 0
	}
	require.NoError(t, err)
	return pid
}

// granted is the condition on pg_locks of a granted advisory lock of
// grantedArgs's key in the current database.
const granted = `locktype = 'advisory' AND granted
	AND classid = $1 AND objid = $2 AND objsubid = $3
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`

// grantedArgs returns pg_locks' classid, objid and objsubid of k, from
// the key's own Int64 or Pair, as the server documents them: a bigint key
// is split into its high and low halves (objsubid 1), and a pair of
// integers is kept (objsubid 2).
func grantedArgs(k txlock.Key) []any {
	if n, ok := k.Int64(); ok {
		return []any{int64(uint32(uint64(n) >> 32)), int64(uint32(n)), 1}
	}
	a, b, _ := k.Pair()
	return []any{int64(uint32(a)), int64(uint32(b)), 2}
}

// ClashingNames returns two keyspace names whose namespaces are equal,
// found by a birthday search (about 2^16 hashes).
func ClashingNames(t testing.TB) (string, string) {
	t.Helper()
	seen := make(map[int32]string, 1<<17)
	for i := range 1 << 20 {
		name := fmt.Sprintf("service-%d", i)
		ns := txlock.NewKeyspace(name).Namespace()
		if other, ok := seen[ns]; ok {
			return other, name
		}
		seen[ns] = name
	}
	t.Fatal("no two names of 2^20 share a namespace")
	return "", ""
}

// RequireNoAdvisoryLocks fails the test unless, within 5 seconds, no
// advisory lock is left in db's database.
func RequireNoAdvisoryLocks(t testing.TB, db *sql.DB) {
	t.Helper()
	var n int
	require.Eventually(t, func() bool {
		err := db.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n)
		return err == nil && n == 0
	}, 5*time.Second, 10*time.Millisecond, "advisory locks left on the server: %d", n)
}

// Hammer runs workers goroutines that each call run iters times, and
// returns the errors they got.
func Hammer(workers, iters int, run func() error) []error {
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for range iters {
				if err := run(); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return errs
}

// Strategies are the ways a WithLock call waits, for the tests that run
// each: the default, polling only, and a ServerWait whose window is far
// shorter than the waits it meets, so that most windows end unanswered.
var Strategies = []struct {
	Name string
	Opts []txlock.Option
}{
	{"default", nil},
	{"polling", []txlock.Option{txlock.WithRetry(txlock.ExponentialBackoff{})}},
	{"ServerWait", []txlock.Option{txlock.WithServerWait(txlock.ServerWait{Window: 5 * time.Millisecond})}},
}

// RequireQuietLog has pools × 2 workers contend for one key through lock,
// for a second with each of Strategies, fn holding the lock for a
// millisecond, and fails the test if the server's log at logPath gains an
// ERROR line meanwhile, or if the run shows nothing (no attempt found the
// lock busy: with ServerWait, no window passed). lock runs fn under the
// key's lock with opts, on the pool numbered pool: one pool per process
// of a fleet.
func RequireQuietLog(t *testing.T, logPath string, pools int, lock func(ctx context.Context, pool int, key txlock.Key, fn func() error, opts ...txlock.Option) error) {
	t.Helper()
	for _, s := range Strategies {
		var busy, calls atomic.Int64
		obs := txlock.WithObserver(txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
			if e.Kind == txlock.Busy {
				busy.Add(1)
			}
			return ctx
		}))
		key := txlock.StringKey(Uniq(t))
		from := LogSize(t, logPath)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var wg sync.WaitGroup
		for p := range pools {
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						err := lock(context.Background(), p, key, func() error { time.Sleep(time.Millisecond); return nil },
							append([]txlock.Option{obs, txlock.WithTimeout(10 * time.Second)}, s.Opts...)...)
						if !assert.NoError(t, err, s.Name) {
							return
						}
						calls.Add(1)
					}
				}()
			}
		}
		wg.Wait()
		cancel()
		errs := ErrorLines(t, logPath, from)
		t.Logf("%s: %d calls, %d busy attempts, %d ERROR lines in the server's log", s.Name, calls.Load(), busy.Load(), len(errs))
		assert.Positive(t, busy.Load(), "%s: no attempt found the lock busy: the run shows nothing", s.Name)
		assert.Empty(t, errs, "%s: the server logged errors", s.Name)
	}
}

// LogSize returns the size of the file at path: where the lines that a
// server writes to its log from now on begin.
func LogSize(t testing.TB, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Size()
}

// ErrorLines returns the lines of the log at path, from offset from on,
// whose level is ERROR (or worse).
func ErrorLines(t testing.TB, path string, from int64) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out []string
	for _, line := range strings.Split(string(b[from:]), "\n") {
		if strings.Contains(line, " ERROR: ") || strings.Contains(line, " FATAL: ") || strings.Contains(line, " PANIC: ") {
			out = append(out, line)
		}
	}
	return out
}

// DoFunc is a driver's Do, for int values, with fn's transaction as a Tx.
type DoFunc func(ctx context.Context, key txlock.Key, fn func(context.Context, Tx) (int, error), opts ...txlock.Option) (int, error)

// TryDoFunc is a driver's TryDo, as DoFunc is its Do.
type TryDoFunc func(ctx context.Context, key txlock.Key, fn func(context.Context, Tx) (int, error)) (int, bool, error)

// RequireDo checks a driver's Do and TryDo on the server of admin: fn's
// value once the transaction has committed, the zero value with fn's error
// or a failed COMMIT, the value of the round that committed after a
// serialization failure (a real 40001), and no fn on a busy lock.
func RequireDo(t *testing.T, admin *sql.DB, do DoFunc, tryDo TryDoFunc) {
	t.Helper()
	ctx := context.Background()
	key := txlock.StringKey(Uniq(t))

	n, err := do(ctx, key, func(ctx context.Context, tx Tx) (int, error) {
		assert.True(t, txlock.Held(ctx))
		return tx.QueryInt(ctx, "SELECT 41 + 1")
	})
	require.NoError(t, err)
	assert.Equal(t, 42, n)

	boom := errors.New("boom")
	n, err = do(ctx, key, func(context.Context, Tx) (int, error) { return 7, boom })
	assert.ErrorIs(t, err, boom)
	assert.Zero(t, n, "fn's value with its error")

	n, err = do(ctx, key, func(ctx context.Context, tx Tx) (int, error) {
		_ = tx.Exec(ctx, "SELECT 1/0") // the transaction fails, and COMMIT rolls it back
		return 7, nil
	})
	assert.ErrorIs(t, err, txlock.ErrCommitFailed)
	assert.Zero(t, n, "the value of a transaction that did not commit")

	rounds := 0
	n, err = do(ctx, key, func(ctx context.Context, tx Tx) (int, error) {
		rounds++
		if rounds == 1 {
			return 1, tx.Exec(ctx, `DO $$ BEGIN RAISE EXCEPTION 'serialization failure' USING ERRCODE = '40001'; END $$`)
		}
		return rounds, nil
	}, txlock.WithSerializationRetries(2))
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the value of the round that committed")

	release := Hold(t, admin, key, false)
	n, ok, err := tryDo(ctx, key, func(context.Context, Tx) (int, error) {
		t.Error("fn ran on a busy lock")
		return 7, nil
	})
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Zero(t, n)
	release()
	n, ok, err = tryDo(ctx, key, func(context.Context, Tx) (int, error) { return 7, nil })
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, 7, n)
}

// BouncerPoolSize returns the default_pool_size of the PgBouncer whose
// admin console is at adminURL: the server connections its clients share.
func BouncerPoolSize(t testing.TB, adminURL string) int {
	t.Helper()
	for _, row := range Rows(t, Open(t, adminURL, 1), "SHOW CONFIG") {
		if row["key"] == "default_pool_size" {
			var n int
			_, err := fmt.Sscan(row["value"], &n)
			require.NoError(t, err)
			return n
		}
	}
	t.Fatal("SHOW CONFIG has no default_pool_size")
	return 0
}

// Rows runs query on db, within 30 seconds, and returns its rows, each as
// column name to text (NULL as ""): the PgBouncer admin console's SHOW
// commands, and the server's views.
func Rows(t testing.TB, db *sql.DB, query string) []map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := db.QueryContext(ctx, query)
	require.NoError(t, err)
	defer rows.Close()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out []map[string]string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(ptrs...))
		row := map[string]string{}
		for i, c := range cols {
			row[c] = vals[i].String
		}
		out = append(out, row)
	}
	require.NoError(t, rows.Err())
	return out
}
