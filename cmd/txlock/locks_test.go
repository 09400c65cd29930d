package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/interop"
)

// locksJSON runs locks --json with args and returns its rows.
func locksJSON(t *testing.T, args ...string) []lockRow {
	t.Helper()
	rows, err := tryLocksJSON(args...)
	require.NoError(t, err)
	return rows
}

// tryLocksJSON is locksJSON for the condition of require.Eventually, which
// runs in a goroutine of its own and so must not fail the test: it returns
// what went wrong instead.
func tryLocksJSON(args ...string) ([]lockRow, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	r := txlockCmd(ctx, nil, append([]string{"locks", "--json"}, args...)...)
	if r.code != 0 {
		return nil, fmt.Errorf("locks --json exited %d: %+v", r.code, r)
	}
	var rows []lockRow
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		var row lockRow
		if err := json.Unmarshal([]byte(line), &row); err != nil {
			return nil, fmt.Errorf("%q: %w", line, err)
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// eventuallyWaiting waits until locks --json with args shows a waiting row
// of application_name app whose wait age is known (on PostgreSQL 14 and
// later, pg_locks.waitstart is NULL for a moment after a wait begins), and
// returns the rows it read last.
func eventuallyWaiting(t *testing.T, app string, args ...string) []lockRow {
	t.Helper()
	var mu sync.Mutex // the condition may still run when Eventually gives up
	var last []lockRow
	var lastErr error
	ok := assert.Eventually(t, func() bool {
		rows, err := tryLocksJSON(args...)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			lastErr = err
			return false
		}
		last = rows
		for _, r := range rows {
			if r.Lock == "waiting" && r.App == app && r.WaitAge != nil {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.True(t, ok, "%s never showed as waiting in pg_locks: last rows %+v, last error %v", app, last, lastErr)
	return last
}

// holdAndWait makes two sessions meet on k: a holder (application_name
// holder-<tag>) takes it with txlock.WithLock and keeps it, and a waiter
// (waiter-<tag>) waits for it in the server's queue (WithServerWait). It
// returns the holder's pid once the waiter shows in pg_locks, seen through
// lockArgs, and the function that lets the holder go and waits for both.
func holdAndWait(t *testing.T, url, tag string, k txlock.Key, lockArgs ...string) (holderPID int, finish func()) {
	t.Helper()
	ctx := context.Background()
	holderDB := openPool(t, withParam(t, url, "application_name", "holder-"+tag))
	waiterDB := openPool(t, withParam(t, url, "application_name", "waiter-"+tag))
	held := make(chan int, 1)
	release := make(chan struct{})
	holderErr := make(chan error, 1)
	go func() {
		holderErr <- txlock.WithLock(ctx, holderDB, k, func(ctx context.Context, tx *sql.Tx) error {
			var pid int
			if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
				return err
			}
			held <- pid
			<-release
			return nil
		})
	}()
	select {
	case holderPID = <-held:
	case err := <-holderErr:
		t.Fatalf("the holder did not get the lock: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the holder did not get the lock in 30s")
	}
	waiterErr := make(chan error, 1)
	go func() {
		waiterErr <- txlock.WithLock(ctx, waiterDB, k, func(context.Context, *sql.Tx) error { return nil },
			txlock.WithServerWait(txlock.ServerWait{Window: time.Minute}), txlock.WithTimeout(2*time.Minute))
	}()
	var once bool
	finish = func() {
		if once {
			return
		}
		once = true
		close(release)
		assert.NoError(t, <-holderErr)
		assert.NoError(t, <-waiterErr)
	}
	t.Cleanup(finish)
	eventuallyWaiting(t, "waiter-"+tag, lockArgs...)
	return holderPID, finish
}

// findRows returns the rows of rows whose application_name is app.
func findRows(rows []lockRow, app string) []lockRow {
	var out []lockRow
	for _, r := range rows {
		if r.App == app {
			out = append(out, r)
		}
	}
	return out
}

// checkHolderAndWaiter checks the holder's and the waiter's rows of rows:
// pid, application_name, the decoded label, and what the waiter waits for.
func checkHolderAndWaiter(t *testing.T, rows []lockRow, tag string, holderPID int, k txlock.Key, keyspace, name, label string) {
	t.Helper()
	c, o, sub := pgLocks(k)
	holder := findRows(rows, "holder-"+tag)
	waiter := findRows(rows, "waiter-"+tag)
	require.Len(t, holder, 1, "%+v", rows)
	require.Len(t, waiter, 1, "%+v", rows)
	for _, r := range []lockRow{holder[0], waiter[0]} {
		assert.Equal(t, []uint32{c, o, uint32(sub)}, []uint32{r.ClassID, r.ObjID, uint32(r.ObjSubID)}, "%+v", r)
		assert.Equal(t, k.String()[strings.LastIndexByte(k.String(), ' ')+1:], r.Key)
		assert.Equal(t, "txlock", r.Tool, "%+v", r)
		assert.Equal(t, keyspace, r.Keyspace, "%+v", r)
		assert.Equal(t, name, r.Name, "%+v", r)
		assert.Equal(t, label, r.Label, "%+v", r)
		assert.Equal(t, "ExclusiveLock", r.Mode)
		assert.NotNil(t, r.XactAge)
	}
	h, w := holder[0], waiter[0]
	require.NotNil(t, h.PID)
	require.NotNil(t, w.PID)
	assert.Equal(t, holderPID, *h.PID)
	assert.Equal(t, "held", h.Lock)
	assert.Nil(t, h.WaitAge)
	assert.Empty(t, h.WaitsFor)
	assert.Equal(t, "waiting", w.Lock)
	assert.NotEqual(t, holderPID, *w.PID)
	assert.Nil(t, h.Prepared)
	assert.Nil(t, w.Prepared)
	require.NotNil(t, w.WaitAge)
	assert.GreaterOrEqual(t, *w.WaitAge, 0.0)
	assert.Equal(t, []int{holderPID}, w.WaitsFor, "the waiter waits for the holder")
	assert.Equal(t, "active", w.State)
	assert.Contains(t, w.Query, "pg_advisory_xact_lock", "the waiter's query is txlock's wait statement")
}

// checkText checks the text view of the same: a line for the holder and one
// for the waiter, with the label, and a header that counts them.
func checkText(t *testing.T, out, tag string, holderPID int, label string) {
	t.Helper()
	assert.Regexp(t, `(?m)^\d+ advisory lock requests on \d+ keys? in database "[^"]+" on 127\.0\.0\.1:\d+ at .*: \d+ held, \d+ waiting$`, out)
	assert.Regexp(t, `(?m)^PID +LOCK +KEY +NAME +APPLICATION +CLIENT +STATE +XACT +WAIT +WAITS FOR +QUERY$`, out)
	assert.Regexp(t, `(?m)^`+strconv.Itoa(holderPID)+` +held +pair\(-?\d+,-?\d+\) +`+regexp.QuoteMeta(label)+` +holder-`+tag+` +127\.0\.0\.1:\d+ +`, out)
	assert.Regexp(t, `(?m)^\d+ +waiting +pair\(-?\d+,-?\d+\) +`+regexp.QuoteMeta(label)+` +waiter-`+tag+` +127\.0\.0\.1:\d+ +active +[0-9.]+s +[0-9.]+s +pid `+strconv.Itoa(holderPID)+` +DO \$txlock\$BEGIN PERFORM pg_catalog`, out)
}

// TestLocksRegistry: the keyspace registry names the keyspace of a lock,
// without flags, and --name names the key in it.
func TestLocksRegistry(t *testing.T) {
	url := freshDatabase(t)
	db := openPool(t, url)
	ks := txlock.NewKeyspace(randomName("billing-"))
	name := randomName("inv-")
	k := ks.Key(name)
	require.NoError(t, txlock.Registry{}.Create(context.Background(), db))
	require.NoError(t, txlock.Registry{}.Register(context.Background(), db, ks))

	holderPID, finish := holdAndWait(t, url, "reg", k, "--db", url)
	_, hash, _ := k.Pair()
	idLabel := ks.String() + "/#" + strconv.Itoa(int(hash))
	checkHolderAndWaiter(t, locksJSON(t, "--db", url), "reg", holderPID, k, ks.String(), "", idLabel)
	checkHolderAndWaiter(t, locksJSON(t, "--db", url, "--name", "other", "--name", name), "reg", holderPID, k, ks.String(), name, ks.String()+"/"+name)

	r := cli(t, "locks", "--db", url, "--name", name)
	require.Equal(t, 0, r.code, "%+v", r)
	t.Log("\n" + r.stdout)
	checkText(t, r.stdout, "reg", holderPID, ks.String()+"/"+name)
	assert.Equal(t, 2, strings.Count(r.stdout, ks.String()+"/"+name), "one line each for the holder and the waiter")

	// Without the registry the key is a number.
	rows := locksJSON(t, "--db", url, "--registry=")
	for _, r := range findRows(rows, "holder-reg") {
		assert.Empty(t, r.Label)
		assert.Empty(t, r.Tool)
	}
	finish()
	assert.Empty(t, locksJSON(t, "--db", url), "no lock is left")
}

// TestLocksPgBouncer: through PgBouncer in transaction mode, the holder and
// the waiter are named from --keyspace and --name.
func TestLocksPgBouncer(t *testing.T) {
	url, _ := pgtest.PgBouncer(t)
	url = withParam(t, url, "default_query_exec_mode", "exec")
	ks := txlock.NewKeyspace(randomName("orders-"))
	name := randomName("order-")
	k := ks.Key(name)
	holderPID, finish := holdAndWait(t, url, "pgb", k, "--db", url)
	args := []string{"--db", url, "--keyspace", ks.String(), "--name", name}
	checkHolderAndWaiter(t, locksJSON(t, args...), "pgb", holderPID, k, ks.String(), name, ks.String()+"/"+name)
	r := cli(t, append([]string{"locks"}, args...)...)
	require.Equal(t, 0, r.code, "%+v", r)
	t.Log("\n" + r.stdout)
	checkText(t, r.stdout, "pgb", holderPID, ks.String()+"/"+name)
	finish()
}

// TestLocksStringKey: a StringKey given by --name is named, and a waiter
// through a bare pg_advisory_xact_lock on another connection shows too,
// waiting for the holder.
func TestLocksStringKey(t *testing.T) {
	url := freshDatabase(t)
	name := randomName("job:")
	k := txlock.StringKey(name)
	n, _ := k.Int64()
	holderPID, finish := holdAndWait(t, url, "str", k, "--db", url)

	bareDB := openPool(t, withParam(t, url, "application_name", "bare-str"))
	bareErr := make(chan error, 1)
	go func() {
		ctx := context.Background()
		tx, err := bareDB.BeginTx(ctx, nil)
		if err != nil {
			bareErr <- err
			return
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", n)); err != nil {
			_ = tx.Rollback()
			bareErr <- err
			return
		}
		bareErr <- tx.Commit()
	}()
	waitBare := sync.OnceValue(func() error { return <-bareErr })
	t.Cleanup(func() {
		finish()
		assert.NoError(t, waitBare(), "the bare waiter")
	})
	rows := eventuallyWaiting(t, "bare-str", "--db", url, "--name", name)

	for _, r := range append(append(findRows(rows, "holder-str"), findRows(rows, "waiter-str")...), findRows(rows, "bare-str")...) {
		assert.Equal(t, name, r.Label)
		assert.Equal(t, name, r.Name)
		assert.Equal(t, "txlock", r.Tool)
		assert.Equal(t, 1, r.ObjSubID)
		assert.Equal(t, "bigint("+strconv.FormatInt(n, 10)+")", r.Key)
	}
	require.Len(t, findRows(rows, "holder-str"), 1)
	require.NotNil(t, findRows(rows, "holder-str")[0].PID)
	assert.Equal(t, holderPID, *findRows(rows, "holder-str")[0].PID)
	bare := findRows(rows, "bare-str")
	require.Len(t, bare, 1)
	b := bare[0]
	assert.Equal(t, "waiting", b.Lock)
	assert.Equal(t, "ExclusiveLock", b.Mode)
	assert.Equal(t, "active", b.State)
	assert.Contains(t, b.WaitsFor, holderPID, "the bare waiter waits for the holder (and for the waiter queued before it)")
	assert.Contains(t, b.Query, fmt.Sprintf("pg_advisory_xact_lock(%d)", n))
	require.NotNil(t, b.WaitAge)
	assert.GreaterOrEqual(t, *b.WaitAge, 0.0)
	finish()
	require.NoError(t, waitBare(), "the bare waiter gets the lock once the holder and the first waiter are done")
}

// psqlPath finds psql where the harness finds the server binaries, or on
// PATH.
func psqlPath(t *testing.T) string {
	t.Helper()
	var dirs []string
	if d := os.Getenv("TXLOCK_TEST_PG_BINDIR"); d != "" {
		dirs = append(dirs, d)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	for _, d := range dirs {
		if p := filepath.Join(d, "psql"); isExecutable(p) {
			return p
		}
	}
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	globbed, _ := filepath.Glob("/usr/lib/postgresql/*/bin/psql")
	if len(globbed) > 0 {
		return globbed[len(globbed)-1]
	}
	pgtest.Unavailable(t, "no psql in TXLOCK_TEST_PG_BINDIR, pg_config --bindir or PATH (on Debian: apt-get install postgresql-client-15)")
	return ""
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode().Perm()&0o111 != 0
}

// psqlSession is a psql process fed statements on its standard input.
type psqlSession struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Scanner
}

func startPsql(t *testing.T, url, app string) *psqlSession {
	t.Helper()
	cmd := exec.Command(psqlPath(t), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", url)
	cmd.Env = append(os.Environ(), "PGAPPNAME="+app)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	s := &psqlSession{cmd: cmd, stdin: stdin, out: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			assert.NoError(t, err, "psql")
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Error("psql did not exit after its input ended")
		}
	})
	return s
}

// query sends one statement and returns its one line of output.
func (s *psqlSession) query(t *testing.T, stmt string) string {
	t.Helper()
	_, err := fmt.Fprintln(s.stdin, stmt)
	require.NoError(t, err)
	require.True(t, s.out.Scan(), "psql ended: %v", s.out.Err())
	return s.out.Text()
}

// TestLocksGolangMigrate: a psql client takes golang-migrate's session lock
// as its postgres driver does, and locks names it.
func TestLocksGolangMigrate(t *testing.T) {
	url := freshDatabase(t)
	db := openPool(t, url)
	var database string
	require.NoError(t, db.QueryRow(`SELECT current_database()`).Scan(&database))
	id, _ := interop.GolangMigrate(database, "public", "schema_migrations").Int64()

	psql := startPsql(t, url, "migrate")
	pid := psql.query(t, "SELECT pg_backend_pid();")
	assert.Equal(t, "", psql.query(t, fmt.Sprintf("SELECT pg_advisory_lock(%d);", id)))

	rows := findRows(locksJSON(t, "--db", url), "migrate")
	require.Len(t, rows, 1)
	r := rows[0]
	require.NotNil(t, r.PID)
	assert.Equal(t, pid, strconv.Itoa(*r.PID))
	assert.Equal(t, "held", r.Lock)
	assert.Equal(t, interop.ToolGolangMigrate, r.Tool)
	assert.Contains(t, r.Label, "golang-migrate")
	assert.Contains(t, r.Label, database)
	assert.Equal(t, "idle", r.State, "a session lock outlives the statement")
	assert.Nil(t, r.XactAge, "a session lock is held outside a transaction")

	out := cli(t, "locks", "--db", url)
	require.Equal(t, 0, out.code, "%+v", out)
	t.Log("\n" + out.stdout)
	assert.Regexp(t, `(?m)^`+pid+` +held +bigint\(`+strconv.FormatInt(id, 10)+`\) +golang-migrate: migration lock of database "`+database+`".* +migrate +127\.0\.0\.1:\d+ +idle +- +- +- +SELECT pg_advisory_lock`, out.stdout)

	// With another migrations table, the default no longer matches.
	rows = findRows(locksJSON(t, "--db", url, "--migrate-table", "app.migrations"), "migrate")
	require.Len(t, rows, 1)
	assert.Empty(t, rows[0].Label)
	assert.Equal(t, "t", psql.query(t, fmt.Sprintf("SELECT pg_advisory_unlock(%d);", id)))

	// golang-migrate's unquoted x-migrations-table=app.migrations is the
	// table "app.migrations" in current_schema(): --migrate-table
	// public.app.migrations names its lock, app.migrations (the table
	// migrations of the schema app) does not.
	dotted, _ := interop.GolangMigrate(database, "public", "app.migrations").Int64()
	assert.Equal(t, "", psql.query(t, fmt.Sprintf("SELECT pg_advisory_lock(%d);", dotted)))
	rows = findRows(locksJSON(t, "--db", url, "--migrate-table", "public.app.migrations"), "migrate")
	require.Len(t, rows, 1)
	assert.Equal(t, interop.ToolGolangMigrate, rows[0].Tool)
	assert.Equal(t, `golang-migrate: migration lock of database "`+database+`" (public.app.migrations)`, rows[0].Label)
	rows = findRows(locksJSON(t, "--db", url, "--migrate-table", "app.migrations"), "migrate")
	require.Len(t, rows, 1)
	assert.Empty(t, rows[0].Label)
	assert.Equal(t, "t", psql.query(t, fmt.Sprintf("SELECT pg_advisory_unlock(%d);", dotted)))
	assert.Empty(t, locksJSON(t, "--db", url))
}

// frameWriter collects what locks --watch prints, and calls done once it
// has printed frames frames (counted by their header lines).
type frameWriter struct {
	mu     sync.Mutex
	buf    strings.Builder
	header string
	frames int
	done   func()
}

func (w *frameWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Count(w.buf.String(), w.header) >= w.frames {
		w.done()
	}
	return len(p), nil
}

func (w *frameWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// watch runs locks --watch with args in e, with a 60 s bound, until it has
// printed frames frames, and returns its exit code and what it printed.
func watch(t *testing.T, e *env, frames int, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out := &frameWriter{header: " in database ", frames: frames, done: cancel}
	e.stdout = out
	code := locksCmd(ctx, e, append([]string{"--watch", "--interval", "100ms"}, args...))
	require.NotErrorIs(t, ctx.Err(), context.DeadlineExceeded, "locks --watch did not print %d frames in 60s: %q", frames, out.String())
	return code, out.String()
}

// plainEnv is the environment of a run whose stdout is not a terminal.
func plainEnv() *env {
	return &env{getenv: func(string) string { return "" }, stderr: &strings.Builder{}}
}

// TestLocksWatch: --watch prints a frame per interval until its context
// ends, then exits 0.
func TestLocksWatch(t *testing.T) {
	url := freshDatabase(t)
	code, out := watch(t, plainEnv(), 2, "--db", url)
	assert.Equal(t, 0, code, "%q", out)
	frames := strings.Count(out, "no advisory locks in database")
	assert.GreaterOrEqual(t, frames, 2, "%q", out)
	assert.NotContains(t, out, "\x1b[", "no escape codes when stdout is not a terminal")
	stamps := regexp.MustCompile(`at (\d\d\d\d-\d\d-\d\d \d\d:\d\d:\d\d)`).FindAllStringSubmatch(out, -1)
	require.Len(t, stamps, frames)
	assert.True(t, slices.IsSortedFunc(stamps, func(a, b []string) int { return strings.Compare(a[1], b[1]) }))
}

// TestLocksWatchRedrawWithoutColour: on a terminal, --watch redraws in
// place whether or not NO_COLOR is set; NO_COLOR takes only the colour
// away.
func TestLocksWatchRedrawWithoutColour(t *testing.T) {
	url := freshDatabase(t)
	dev, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0) // a character device, as a terminal is
	require.NoError(t, err)
	defer dev.Close()
	e := newEnv(func(k string) string { return map[string]string{"NO_COLOR": "1"}[k] }, dev, &strings.Builder{})
	require.True(t, e.terminal)
	require.False(t, e.colour)

	holderPID, finish := holdAndWait(t, url, "nocolour", txlock.StringKey(randomName("nocolour-")), "--db", url)
	_, out := watch(t, e, 2, "--db", url)
	assert.Equal(t, 2, strings.Count(out, "\x1b[H\x1b[2J"), "each frame starts by clearing the screen: %q", out)
	assert.NotRegexp(t, sgr, out, "no colour with NO_COLOR")
	assert.Contains(t, out, "holder-nocolour")
	assert.Contains(t, out, strconv.Itoa(holderPID))
	finish()

	e.colour = true
	_, out = watch(t, e, 1, "--db", url)
	assert.True(t, strings.HasPrefix(out, "\x1b[H\x1b[2J"), "%q", out)
}

// TestLocksPreparedTransaction: a prepared transaction holds a key, without
// a session, and a session waits for it. locks shows the holder as the
// prepared transaction, with its gid, owner and age, and the waiter as
// waiting for it (pg_blocking_pids reports it as pid 0), in text and JSON.
func TestLocksPreparedTransaction(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{Settings: map[string]string{"max_prepared_transactions": "5"}})
	url := c.URL()
	ctx := context.Background()
	ks := txlock.NewKeyspace(randomName("ledger-"))
	name := "entry-1"
	k := ks.Key(name)
	a, b, _ := k.Pair()
	const gid = "txlock test 'prep'"
	gidSQL := "'txlock test ''prep'''"

	db := openPool(t, url)
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	for _, stmt := range []string{"BEGIN", fmt.Sprintf("SELECT pg_advisory_xact_lock(%d, %d)", a, b), "PREPARE TRANSACTION " + gidSQL} {
		_, err := conn.ExecContext(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	require.NoError(t, conn.Close())
	ended := false
	end := func() { // if the test stops early
		if !ended {
			ended = true
			_, err := db.Exec("ROLLBACK PREPARED " + gidSQL)
			assert.NoError(t, err)
		}
	}
	t.Cleanup(end)

	waiterDB := openPool(t, withParam(t, url, "application_name", "waiter-prep"))
	waiterErr := make(chan error, 1)
	go func() {
		waiterErr <- txlock.WithLock(ctx, waiterDB, k, func(context.Context, *sql.Tx) error { return nil },
			txlock.WithServerWait(txlock.ServerWait{Window: time.Minute}), txlock.WithTimeout(2*time.Minute))
	}()
	waitDone := sync.OnceValue(func() error { return <-waiterErr })
	t.Cleanup(func() {
		end() // first, or the waiter waits for it
		assert.NoError(t, waitDone(), "the waiter")
	})

	args := []string{"--db", url, "--keyspace", ks.String(), "--name", name}
	rows := eventuallyWaiting(t, "waiter-prep", args...)
	require.Len(t, rows, 2, "%+v", rows)
	p, w := rows[0], rows[1]
	assert.Nil(t, p.PID, "a prepared transaction has no backend")
	assert.Equal(t, "held", p.Lock)
	assert.Equal(t, "ExclusiveLock", p.Mode)
	require.NotNil(t, p.Prepared, "%+v", p)
	assert.Equal(t, gid, p.Prepared.GID)
	assert.Equal(t, "txlock", p.Prepared.Owner)
	assert.GreaterOrEqual(t, p.Prepared.Age, 0.0)
	assert.Nil(t, p.XactAge)
	assert.Empty(t, p.App)
	for _, r := range rows {
		assert.Equal(t, ks.String()+"/"+name, r.Label)
		assert.Equal(t, "txlock", r.Tool)
	}
	assert.Equal(t, "waiting", w.Lock)
	assert.Equal(t, "waiter-prep", w.App)
	require.NotNil(t, w.PID)
	assert.Nil(t, w.Prepared)
	assert.Equal(t, []int{0}, w.WaitsFor, "pg_blocking_pids reports a prepared transaction as 0")
	assert.Equal(t, []string{gid}, w.WaitsForPrepared)

	r := cli(t, append([]string{"locks"}, args...)...)
	require.Equal(t, 0, r.code, "%+v", r)
	t.Log("\n" + r.stdout)
	label := regexp.QuoteMeta(ks.String() + "/" + name)
	pair := regexp.QuoteMeta(fmt.Sprintf("pair(%d,%d)", a, b))
	assert.Regexp(t, `(?m)^2 advisory lock requests on 1 key in database "postgres" on 127\.0\.0\.1:\d+ at .*: 1 held, 1 waiting$`, r.stdout)
	assert.Regexp(t, `(?m)^- +held +`+pair+` +`+label+` +- +- +`+regexp.QuoteMeta("prepared "+gidSQL+" by txlock")+` +[0-9.]+s +- +- +-$`, r.stdout)
	assert.Regexp(t, `(?m)^`+strconv.Itoa(*w.PID)+` +waiting +`+pair+` +`+label+` +waiter-prep +127\.0\.0\.1:\d+ +active +[0-9.]+s +[0-9.]+s +`+regexp.QuoteMeta("prepared "+gidSQL)+` +DO \$txlock\$BEGIN `, r.stdout)

	// COMMIT PREPARED releases the key: the waiter gets it.
	_, err = db.Exec("COMMIT PREPARED " + gidSQL)
	require.NoError(t, err)
	ended = true
	require.NoError(t, waitDone())
	assert.Empty(t, locksJSON(t, args...), "no lock is left")
}

// TestLocksEscapesControlCharacters: a keyspace name of the registry and a
// query that hold terminal escape sequences reach the text output escaped,
// cut between escapes; the JSON has them exactly.
func TestLocksEscapesControlCharacters(t *testing.T) {
	url := freshDatabase(t)
	ctx := context.Background()
	db := openPool(t, url)
	ks := txlock.NewKeyspace("bill\x1b[2Jing")
	require.NoError(t, ks.Err(), "the library's key-name rules allow an ESC")
	require.NoError(t, txlock.Registry{}.Create(ctx, db))
	require.NoError(t, txlock.Registry{}.Register(ctx, db, ks))
	const query = "SELECT 1 /* \x1b]0;owned\x07\x1b[31m red \u009b\x7f */"

	holderDB := openPool(t, withParam(t, url, "application_name", "esc-holder"))
	held := make(chan struct{})
	release := make(chan struct{})
	holderErr := make(chan error, 1)
	go func() {
		holderErr <- txlock.WithLock(ctx, holderDB, ks.Key("inv"), func(ctx context.Context, tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, query); err != nil {
				return err
			}
			close(held)
			<-release
			return nil
		})
	}()
	select {
	case <-held:
	case err := <-holderErr:
		t.Fatalf("the holder did not get the lock: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the holder did not get the lock in 30s")
	}
	defer func() {
		close(release)
		assert.NoError(t, <-holderErr)
	}()

	rows := findRows(locksJSON(t, "--db", url), "esc-holder")
	require.Len(t, rows, 1)
	assert.Equal(t, query, rows[0].Query, "the JSON has the query exactly")
	assert.Equal(t, ks.String(), rows[0].Keyspace)

	r := cli(t, "locks", "--db", url, "--query-width", "200")
	require.Equal(t, 0, r.code, "%+v", r)
	t.Log("\n" + r.stdout)
	for _, c := range []string{"\x1b", "\x07", "\u009b", "\x7f"} {
		assert.NotContains(t, r.stdout, c)
	}
	assert.Contains(t, r.stdout, `bill\x1b[2Jing/#`)
	assert.Contains(t, r.stdout, `SELECT 1 /* \x1b]0;owned\x07\x1b[31m red \u009b\x7f */`)

	// A width that ends inside the first escape cuts before it.
	r = cli(t, "locks", "--db", url, "--query-width", "14")
	require.Equal(t, 0, r.code, "%+v", r)
	assert.Regexp(t, `(?m) SELECT 1 /\* …$`, r.stdout)
}

// TestVisible: control characters are escaped, other text is left alone,
// and shorten cuts between escapes.
func TestVisible(t *testing.T) {
	for in, want := range map[string]string{
		"plain ünï ✓":      "plain ünï ✓",
		"a\x1b[2Jb":        `a\x1b[2Jb`,
		"tab\tnl\ncr\r":    `tab\tnl\ncr\r`,
		"\x00\x07\x1f\x7f": `\x00\x07\x1f\x7f`,
		"c1\u0085\u009b":   `c1\u0085\u009b`,
		"bad\xffbyte":      `bad\xffbyte`,
		`back\slash`:       `back\slash`,
		"\u00a0\u200b":     "\u00a0\u200b",
	} {
		assert.Equal(t, want, visible(in), "visible(%q)", in)
	}
	for _, c := range []struct {
		in   string
		n    int
		want string
	}{
		{"ab\x1bc", 7, `ab\x1bc`},
		{"ab\x1bc", 6, `ab…`},
		{"ab\x1bc", 4, `ab…`},
		{"ab\x1bcd", 8, `ab\x1bcd`},
		{"ab\x1bcdef", 8, `ab\x1bc…`},
		{"a \t\n b", 10, "a b"},
		{"", 5, "-"},
	} {
		assert.Equal(t, c.want, shorten(c.in, c.n), "shorten(%q, %d)", c.in, c.n)
	}
}

// TestLocksRegistryMissing: a registry that is not there is passed over in
// silence when --registry is not given, and warned about, naming the table,
// when it is; with --watch, the warning is a line of every frame.
func TestLocksRegistryMissing(t *testing.T) {
	url := freshDatabase(t)
	r := cli(t, "locks", "--db", url)
	assert.Equal(t, 0, r.code, "%+v", r)
	assert.Empty(t, r.stderr, "no registry at the default place: nothing to say")

	for _, reg := range []string{"public.no_such_registry", "public.txlock_keyspaces", "nowhere.txlock_keyspaces"} {
		r := cli(t, "locks", "--db", url, "--registry", reg)
		assert.Equal(t, 0, r.code, "%+v", r)
		assert.Contains(t, r.stdout, "no advisory locks in database")
		assert.Equal(t, "txlock locks: the keyspace registry "+reg+" (--registry) does not exist: no keyspace is named from it (create it with txlock.Registry.Create, or give --registry= to read none)\n", r.stderr)
	}

	warning := regexp.QuoteMeta("txlock locks: the keyspace registry public.no_such_registry (--registry) does not exist")
	e := plainEnv()
	_, out := watch(t, e, 2, "--db", url, "--registry", "public.no_such_registry")
	assert.Empty(t, e.stderr.(*strings.Builder).String(), "in watch mode the warning is on stdout")
	assert.Len(t, regexp.MustCompile(`(?m)^`+warning+`.*\nno advisory locks in database`).FindAllString(out, -1), 2,
		"each frame starts with the warning: %q", out)

	e = plainEnv()
	e.terminal = true
	_, out = watch(t, e, 2, "--db", url, "--registry", "public.no_such_registry")
	assert.Len(t, regexp.MustCompile(regexp.QuoteMeta("\x1b[H\x1b[2J")+warning).FindAllString(out, -1), 2,
		"the warning follows the clearing of the screen, in each frame: %q", out)
}

// TestLocksAgesAtReadTime: ages are measured when pg_locks is read, not
// at the start of the reading transaction: read from a transaction that
// began before the holder's and the waiter's, none is negative.
func TestLocksAgesAtReadTime(t *testing.T) {
	url := freshDatabase(t)
	ctx := context.Background()
	db := openPool(t, url)
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	var began time.Time
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT now()`).Scan(&began))
	time.Sleep(time.Second) // now() of tx stays here

	holderPID, finish := holdAndWait(t, url, "ages", txlock.StringKey(randomName("ages-")), "--db", url)
	rows, _, err := readLocks(ctx, tx)
	require.NoError(t, err)
	h, w := findRows(rows, "holder-ages"), findRows(rows, "waiter-ages")
	require.Len(t, h, 1, "%+v", rows)
	require.Len(t, w, 1, "%+v", rows)
	require.NotNil(t, h[0].PID)
	assert.Equal(t, holderPID, *h[0].PID)
	for _, r := range []lockRow{h[0], w[0]} {
		require.NotNil(t, r.XactAge)
		assert.GreaterOrEqual(t, *r.XactAge, 0.0, "%s: its transaction began after the reader's", r.App)
	}
	require.NotNil(t, w[0].WaitAge, "holdAndWait waits until the wait start is set")
	assert.GreaterOrEqual(t, *w[0].WaitAge, 0.0, "the wait began after the reader's transaction")
	finish()
}

// TestLocksOwner: a holder that WithOwner names shows under that name, as
// its application_name, while it holds the lock.
func TestLocksOwner(t *testing.T) {
	url := freshDatabase(t)
	db := openPool(t, withParam(t, url, "application_name", "owner-app"))
	label := randomName("export-worker req ")
	var rows []lockRow
	err := txlock.WithLock(context.Background(), db, txlock.StringKey(randomName("export-")), func(context.Context, *sql.Tx) error {
		rows = locksJSON(t, "--db", url)
		return nil
	}, txlock.WithOwner(label))
	require.NoError(t, err)
	held := findRows(rows, label)
	require.Len(t, held, 1, "%+v", rows)
	assert.Equal(t, "held", held[0].Lock)
	assert.Empty(t, findRows(rows, "owner-app"), "the session's own name is not shown while the label is")
}

// holdSlot takes the advisory lock of key k in a transaction of its own,
// on a connection of application_name app, and keeps it until the test
// ends: a session that takes slot i of a semaphore by hand, as psql would.
// With queued, another session holds k: the session waits for k in the
// background, until the wait is cancelled when the test ends.
func holdSlot(t *testing.T, url, app string, k txlock.Key, queued bool) {
	t.Helper()
	ctx := context.Background()
	db := openPool(t, withParam(t, url, "application_name", app))
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	lock := fmt.Sprintf("SELECT pg_advisory_xact_lock(%s)", numbers(k))
	if !queued {
		_, err = tx.ExecContext(ctx, lock)
		require.NoError(t, err)
		t.Cleanup(func() { assert.NoError(t, tx.Rollback()) })
		return
	}
	done := make(chan error, 1)
	go func() {
		_, err := tx.ExecContext(ctx, lock)
		done <- err
	}()
	t.Cleanup(func() {
		// The holder's cleanup, registered before, runs after this one:
		// end the wait from the server's side first.
		var pid int
		if assert.NoError(t, db.QueryRowContext(ctx, `SELECT pid FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&pid)) {
			_, err := db.ExecContext(ctx, `SELECT pg_cancel_backend($1)`, pid)
			assert.NoError(t, err)
		}
		assert.Error(t, <-done, "the wait ends cancelled")
		_ = tx.Rollback()
	})
}

// TestLocksSemaphore: with --semaphore NAME=N, a lock of slot i of the
// semaphore, held or waited for, shows as "semaphore NAME, slot i of N", in
// the JSON (label, name, semaphore) and in the text; as a StringKey, in a
// keyspace, and for a holder that txlock.WithSemaphore placed. A slot at N
// or above is not the semaphore's.
func TestLocksSemaphore(t *testing.T) {
	url := freshDatabase(t)
	ctx := context.Background()
	k := txlock.StringKey("orders-export")
	ks := txlock.NewKeyspace(randomName("billing-"))

	holdSlot(t, url, "slot-holder", txlock.SlotKey(k, 3), false)
	holdSlot(t, url, "slot-beyond", txlock.SlotKey(k, 8), false)
	holdSlot(t, url, "slot-keyspace", txlock.SlotKey(ks.Key("orders-export"), 5), false)
	holdSlot(t, url, "slot-waiter", txlock.SlotKey(k, 3), true)

	// A holder of the library's, whose slot the server picks.
	libDB := openPool(t, withParam(t, url, "application_name", "slot-lib"))
	slot := make(chan int, 1)
	release := make(chan struct{})
	libErr := make(chan error, 1)
	go func() {
		libErr <- txlock.WithSemaphore(ctx, libDB, k, 8, func(ctx context.Context, _ *sql.Tx) error {
			l, _ := txlock.LockFromContext(ctx)
			slot <- l.Slot
			<-release
			return nil
		})
	}()
	var libSlot int
	select {
	case libSlot = <-slot:
	case err := <-libErr:
		t.Fatalf("WithSemaphore did not get a slot: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("WithSemaphore did not get a slot in 30s")
	}
	t.Cleanup(func() {
		close(release)
		assert.NoError(t, <-libErr)
	})
	require.NotEqual(t, 3, libSlot, "slot 3 is taken")

	args := []string{"--db", url, "--keyspace", ks.String(), "--semaphore", "orders-export=8"}
	rows := eventuallyWaiting(t, "slot-waiter", args...)
	for app, want := range map[string]struct {
		lock, keyspace, label string
		slot                  int
	}{
		"slot-holder":   {"held", "", "semaphore orders-export, slot 3 of 8", 3},
		"slot-waiter":   {"waiting", "", "semaphore orders-export, slot 3 of 8", 3},
		"slot-keyspace": {"held", ks.String(), "semaphore " + ks.String() + "/orders-export, slot 5 of 8", 5},
		"slot-lib":      {"held", "", fmt.Sprintf("semaphore orders-export, slot %d of 8", libSlot), libSlot},
	} {
		got := findRows(rows, app)
		require.Len(t, got, 1, "%s: %+v", app, rows)
		r := got[0]
		assert.Equal(t, want.lock, r.Lock, app)
		assert.Equal(t, want.label, r.Label, app)
		assert.Equal(t, "txlock", r.Tool, app)
		assert.Equal(t, "orders-export", r.Name, app)
		assert.Equal(t, want.keyspace, r.Keyspace, app)
		assert.Equal(t, &semaphoreSlot{Slot: want.slot, Slots: 8}, r.Semaphore, app)
		v, _ := txlock.SlotKey(k, want.slot).Int64()
		if want.keyspace != "" {
			v, _ = txlock.SlotKey(ks.Key("orders-export"), want.slot).Int64()
		}
		assert.Equal(t, "bigint("+strconv.FormatInt(v, 10)+")", r.Key, app)
	}
	beyond := findRows(rows, "slot-beyond")
	require.Len(t, beyond, 1)
	assert.Empty(t, beyond[0].Label, "slot 8 is no slot of a semaphore of 8")
	assert.Nil(t, beyond[0].Semaphore)

	// The JSON line, as a script reads it.
	r := cli(t, "locks", "--json", "--db", url, "--semaphore", "orders-export=8")
	require.Equal(t, 0, r.code, "%+v", r)
	var line string
	for _, l := range strings.Split(r.stdout, "\n") {
		if strings.Contains(l, `"application_name":"slot-holder"`) {
			line = l
		}
	}
	t.Log(line)
	assert.Contains(t, line, `"tool":"txlock","name":"orders-export","label":"semaphore orders-export, slot 3 of 8",`)
	assert.Contains(t, line, `"semaphore":{"slot":3,"slots":8}`)

	// Without --semaphore, the slots are bare numbers.
	for _, r := range locksJSON(t, "--db", url) {
		assert.Empty(t, r.Label, "%+v", r)
		assert.Nil(t, r.Semaphore, "%+v", r)
	}

	r = cli(t, append([]string{"locks"}, args...)...)
	require.Equal(t, 0, r.code, "%+v", r)
	t.Log("\n" + r.stdout)
	v3, _ := txlock.SlotKey(k, 3).Int64()
	v5, _ := txlock.SlotKey(ks.Key("orders-export"), 5).Int64()
	slot3 := regexp.QuoteMeta(fmt.Sprintf("bigint(%d)", v3)) + ` +semaphore orders-export, slot 3 of 8 +`
	assert.Regexp(t, `(?m)^\d+ +held +`+slot3+`slot-holder +`, r.stdout)
	assert.Regexp(t, `(?m)^\d+ +waiting +`+slot3+`slot-waiter +.* pid \d+ +SELECT pg_advisory_xact_lock`, r.stdout)
	assert.Regexp(t, `(?m)^\d+ +held +`+regexp.QuoteMeta(fmt.Sprintf("bigint(%d) ", v5))+` *`+regexp.QuoteMeta("semaphore "+ks.String()+"/orders-export, slot 5 of 8")+` +slot-keyspace +`, r.stdout)
	assert.Regexp(t, `(?m)^\d+ +held +bigint\(-?\d+\) +`+regexp.QuoteMeta(fmt.Sprintf("semaphore orders-export, slot %d of 8", libSlot))+` +slot-lib +`, r.stdout)
	assert.Regexp(t, `(?m)^\d+ +held +bigint\(-?\d+\) +- +slot-beyond +`, r.stdout)
}

// TestLocksSemaphoreFlag: --semaphore splits NAME=N at the last =, so a
// NAME may hold one, and takes N from 1 to MaxKeys; anything else is a
// usage error that names the flag and the bound.
func TestLocksSemaphoreFlag(t *testing.T) {
	var l semaphoreList
	require.NoError(t, l.Set("orders-export=8"))
	require.NoError(t, l.Set("a=b=1000"))
	require.NoError(t, l.Set("one=1"))
	assert.Equal(t, semaphoreList{{"orders-export=8", "orders-export", 8}, {"a=b=1000", "a=b", 1000}, {"one=1", "one", 1}}, l)

	for flag, msg := range map[string]string{
		"orders-export=0":    "a semaphore has 1 to 1000 slots (txlock.MaxKeys), got 0",
		"orders-export=1001": "a semaphore has 1 to 1000 slots (txlock.MaxKeys), got 1001",
		"orders-export=-3":   "a semaphore has 1 to 1000 slots (txlock.MaxKeys), got -3",
		"orders-export=":     `want NAME=N, such as orders-export=8: N "" is not a number`,
		"a=8=x":              `want NAME=N, such as orders-export=8: N "x" is not a number`,
		"orders-export":      "want NAME=N, such as orders-export=8",
	} {
		r := cli(t, "locks", "--db", "postgres://x@127.0.0.1/db", "--semaphore", flag)
		assert.Equal(t, 2, r.code, "%s: %+v", flag, r)
		first, _, _ := strings.Cut(r.stderr, "\n")
		assert.Equal(t, fmt.Sprintf("txlock locks: invalid value %q for flag -semaphore: %s", flag, msg), first)
		assert.Contains(t, r.stderr, "Usage: txlock locks")
		assert.Empty(t, r.stdout)
	}
	r := cli(t, "locks", "--db", "postgres://x@127.0.0.1/db", "--semaphore", "=8")
	assert.Equal(t, 2, r.code, "%+v", r)
	assert.True(t, strings.HasPrefix(r.stderr, `txlock locks: --semaphore "=8": `), "%q", r.stderr)
}

// TestLocksOwnerPgBouncer: through PgBouncer in transaction mode, a
// semaphore's holder named with WithOwner shows in `txlock locks --json`
// with its label, as the application_name of its slot, and the session's
// own name is not shown while the label is.
func TestLocksOwnerPgBouncer(t *testing.T) {
	url, _ := pgtest.PgBouncer(t)
	url = withParam(t, url, "default_query_exec_mode", "exec")
	db := openPool(t, withParam(t, url, "application_name", "owner-pgb"))
	name := randomName("export-")
	label := randomName("export replica-2 job ")
	var rows []lockRow
	var slot int
	err := txlock.WithSemaphore(context.Background(), db, txlock.StringKey(name), 4, func(ctx context.Context, _ *sql.Tx) error {
		l, _ := txlock.LockFromContext(ctx)
		slot = l.Slot
		rows = locksJSON(t, "--db", url, "--semaphore", name+"=4")
		return nil
	}, txlock.WithOwner(label))
	require.NoError(t, err)
	held := findRows(rows, label)
	require.Len(t, held, 1, "%+v", rows)
	assert.Equal(t, "held", held[0].Lock)
	assert.Equal(t, &semaphoreSlot{Slot: slot, Slots: 4}, held[0].Semaphore)
	assert.Equal(t, fmt.Sprintf("semaphore %s, slot %d of 4", name, slot), held[0].Label)
	assert.Empty(t, findRows(rows, "owner-pgb"), "the session's own name is not shown while the label is")
}
