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
	r := cli(t, append([]string{"locks", "--json"}, args...)...)
	require.Equal(t, 0, r.code, "%+v", r)
	var rows []lockRow
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		if line == "" {
			continue
		}
		var row lockRow
		require.NoError(t, json.Unmarshal([]byte(line), &row), "%q", line)
		rows = append(rows, row)
	}
	return rows
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
	require.Eventually(t, func() bool {
		for _, r := range locksJSON(t, lockArgs...) {
			if r.Lock == "waiting" && r.App == "waiter-"+tag {
				return true
			}
		}
		return false
	}, 30*time.Second, 50*time.Millisecond, "the waiter never showed in pg_locks")
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
	assert.Equal(t, holderPID, h.PID)
	assert.Equal(t, "held", h.Lock)
	assert.Nil(t, h.WaitAge)
	assert.Empty(t, h.WaitsFor)
	assert.Equal(t, "waiting", w.Lock)
	assert.NotEqual(t, holderPID, w.PID)
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
	assert.Regexp(t, `(?m)^\d+ advisory locks in database "[^"]+" on 127\.0\.0\.1:\d+ at .*: \d+ held, \d+ waiting$`, out)
	assert.Regexp(t, `(?m)^PID +LOCK +KEY +NAME +APPLICATION +CLIENT +STATE +XACT +WAIT +WAITS FOR +QUERY$`, out)
	assert.Regexp(t, `(?m)^`+strconv.Itoa(holderPID)+` +held +pair\(-?\d+,-?\d+\) +`+regexp.QuoteMeta(label)+` +holder-`+tag+` +127\.0\.0\.1:\d+ +`, out)
	assert.Regexp(t, `(?m)^\d+ +waiting +pair\(-?\d+,-?\d+\) +`+regexp.QuoteMeta(label)+` +waiter-`+tag+` +127\.0\.0\.1:\d+ +active +[0-9.]+s +[0-9.]+s +pid `+strconv.Itoa(holderPID)+` +SELECT 1 FROM pg_catalog`, out)
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
// through a bare pg_advisory_xact_lock on another connection shows too.
func TestLocksStringKey(t *testing.T) {
	url := freshDatabase(t)
	name := randomName("job:")
	k := txlock.StringKey(name)
	holderPID, finish := holdAndWait(t, url, "str", k, "--db", url)
	rows := locksJSON(t, "--db", url, "--name", name)
	for _, r := range append(findRows(rows, "holder-str"), findRows(rows, "waiter-str")...) {
		assert.Equal(t, name, r.Label)
		assert.Equal(t, name, r.Name)
		assert.Equal(t, "txlock", r.Tool)
		assert.Equal(t, 1, r.ObjSubID)
	}
	assert.Len(t, findRows(rows, "holder-str"), 1)
	assert.Equal(t, holderPID, findRows(rows, "holder-str")[0].PID)
	finish()
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
	assert.Equal(t, pid, strconv.Itoa(r.PID))
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
	assert.Empty(t, locksJSON(t, "--db", url))
}

// TestLocksWatch: --watch prints a frame per interval until its context
// ends, then exits 0.
func TestLocksWatch(t *testing.T) {
	url := freshDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	r := txlockCmd(ctx, nil, "locks", "--db", url, "--watch", "--interval", "100ms")
	assert.Equal(t, 0, r.code, "%+v", r)
	frames := strings.Count(r.stdout, "no advisory locks in database")
	assert.GreaterOrEqual(t, frames, 2, "%q", r.stdout)
	assert.NotContains(t, r.stdout, "\x1b[", "no escape codes when stdout is not a terminal")
	stamps := regexp.MustCompile(`at (\d\d\d\d-\d\d-\d\d \d\d:\d\d:\d\d)`).FindAllStringSubmatch(r.stdout, -1)
	require.Len(t, stamps, frames)
	assert.True(t, slices.IsSortedFunc(stamps, func(a, b []string) int { return strings.Compare(a[1], b[1]) }))
}
