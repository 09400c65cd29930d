package locktest

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

// Terms across processes: a test binary re-executes itself as candidate
// processes, which get the server's URL from their environment and never
// start servers of their own: the binary's init calls TermChild, and exits
// with its result, before TestMain, and so before the harness, runs.

// TermChildEnv, set in a test binary's environment, makes it a candidate
// process of the mode it names (see TermChild).
const TermChildEnv = "TXLOCK_TERM_CHILD"

// TermDriver is a driver's terms on one pool, as a candidate process uses
// them.
type TermDriver struct {
	// Lead is the driver's Lead on its pool.
	Lead func(ctx context.Context, key txlock.Key, fn func(context.Context, *txlock.Term) error, opts ...txlock.TermOption) error
	// Update is ft.Update on the driver's pool.
	Update func(ctx context.Context, ft txlock.FencedTable, token int64, set, where []txlock.Col) (int64, error)
	// Close closes the pool.
	Close func()
}

// TermOpener opens a driver's pool on url, of at most 4 connections.
type TermOpener func(url string) (TermDriver, error)

// TermSteadyBeat is the heartbeat of tests that hold a term without
// measuring how it ends, such as TermsAcrossProcesses' candidates, where a
// loss would fail the process: the default interval, a Timeout that a
// loaded machine's pause does not reach, and a TTL so long that a lock the
// server frees only at the TTL, rather than when the term ends, would show
// as far too late.
var TermSteadyBeat = txlock.Heartbeat{Timeout: 3 * time.Second, TTL: 10 * time.Second}

// TermChild is the body of a candidate process, whose mode is
// TermChildEnv's value: "candidate" leads TXLOCK_TERMS terms of
// TXLOCK_HOLD each and records them (TermsAcrossProcesses); "stopped"
// leads one term, which its parent freezes, and reports what it finds when
// it is thawed (StoppedLeader). Its terms are the driver's that open opens;
// its records go through database/sql. It returns the process's exit code.
func TermChild(mode string, open TermOpener) int {
	url := os.Getenv("TXLOCK_CHILD_URL")
	err := func() error {
		d, err := open(url)
		if err != nil {
			return err
		}
		defer d.Close()
		key := txlock.StringKey(os.Getenv("TXLOCK_CHILD_KEY"))
		table := os.Getenv("TXLOCK_CHILD_TABLE")
		switch mode {
		case "candidate":
			db, err := sql.Open("pgx", url)
			if err != nil {
				return err
			}
			defer db.Close()
			return termCandidate(d, db, key, table)
		case "stopped":
			return stoppedLeader(d, key, table)
		}
		return fmt.Errorf("unknown %s %q", TermChildEnv, mode)
	}()
	if err != nil {
		fmt.Fprintf(os.Stderr, "candidate %d: %v\n", os.Getpid(), err)
		return 1
	}
	return 0
}

// termCandidate leads its terms one after the other, each recorded in
// table, through db, with the server's clock_timestamp() at its start and
// end, and pauses after each so that the other candidates can win the next.
func termCandidate(d TermDriver, db *sql.DB, key txlock.Key, table string) error {
	terms, err := strconv.Atoi(os.Getenv("TXLOCK_TERMS"))
	if err != nil {
		return err
	}
	holdFor, err := time.ParseDuration(os.Getenv("TXLOCK_HOLD"))
	if err != nil {
		return err
	}
	ctx := context.Background()
	for range terms {
		start := time.Now()
		err := d.Lead(ctx, key, func(ctx context.Context, term *txlock.Term) error {
			waited := time.Since(start)
			var id int64
			if err := db.QueryRowContext(ctx, `INSERT INTO `+table+` (pid, token, waited_ms, started_at) VALUES ($1, $2, $3, clock_timestamp()) RETURNING id`,
				os.Getpid(), term.Token(), waited.Milliseconds()).Scan(&id); err != nil {
				return err
			}
			select {
			case <-time.After(holdFor):
			case <-ctx.Done():
				return context.Cause(ctx)
			}
			_, err := db.ExecContext(ctx, `UPDATE `+table+` SET ended_at = clock_timestamp() WHERE id = $1`, id)
			return err
		}, txlock.WithHeartbeat(TermSteadyBeat))
		if err != nil {
			return err
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// stoppedLeader leads one term and prints its token; its parent then
// freezes it (SIGSTOP), writes "check" on its stdin and thaws it. It
// reports whether its context had ended at once, why, and what became of
// a fenced write with its token.
func stoppedLeader(d TermDriver, key txlock.Key, table string) error {
	ttl, err := time.ParseDuration(os.Getenv("TXLOCK_TTL"))
	if err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	ft := txlock.FencedTable{Name: table}
	err = d.Lead(context.Background(), key, func(ctx context.Context, term *txlock.Term) error {
		fmt.Printf("token %d\n", term.Token())
		if !in.Scan() { // frozen here
			return errors.New("no instruction")
		}
		// The first thing the thawed holder does is look at its context.
		ended := ctx.Err() != nil
		cause := context.Cause(ctx)
		_, err := d.Update(context.Background(), ft, term.Token(), []txlock.Col{{Name: "qty", Value: 49}}, []txlock.Col{{Name: "id", Value: 1}})
		var stale *txlock.StaleTokenError
		write := "written"
		switch {
		case errors.As(err, &stale):
			write = fmt.Sprintf("stale current=%d", stale.Current)
		case err != nil:
			write = "error " + err.Error()
		}
		fmt.Printf("ended=%t lost=%t write=%s\n", ended, errors.Is(cause, txlock.ErrLockLost), write)
		return nil
	}, txlock.WithHeartbeat(txlock.Heartbeat{Interval: ttl / 5, Timeout: ttl, TTL: ttl})) // each heartbeat allowed until the local expiry: a slow one does not end the term before the freeze
	fmt.Printf("lead lost=%t\n", errors.Is(err, txlock.ErrLockLost))
	return nil
}

// termChild returns the test binary as a candidate process in mode, on
// url.
func termChild(mode, url string, env ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), append([]string{TermChildEnv + "=" + mode, "TXLOCK_CHILD_URL=" + url}, env...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

// TermsAcrossProcesses is the exclusion test: 16 candidate processes of
// the test binary (TermChild) on url lead two terms each, one after the
// other, each recorded with the server's clock_timestamp(). No two
// recorded terms may overlap, tokens must grow with the terms, and every
// candidate must get its terms while the others keep campaigning. db
// reaches the server directly, and has the fencing sequence.
func TermsAcrossProcesses(t *testing.T, db *sql.DB, url string) {
	t.Helper()
	table := "terms_" + TableSuffix(t)
	_, err := db.Exec(`CREATE TABLE ` + table + ` (id bigserial PRIMARY KEY, pid int NOT NULL, token bigint NOT NULL, waited_ms bigint NOT NULL,
		started_at timestamptz NOT NULL, ended_at timestamptz)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
	key := Uniq(t)
	const candidates, terms = 16, 2
	var cmds []*exec.Cmd
	start := time.Now()
	for range candidates {
		cmd := termChild("candidate", url, "TXLOCK_CHILD_KEY="+key, "TXLOCK_CHILD_TABLE="+table,
			"TXLOCK_TERMS="+strconv.Itoa(terms), "TXLOCK_HOLD=100ms")
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		cmds = append(cmds, cmd)
	}
	exited := make(chan error, candidates)
	for _, cmd := range cmds {
		go func() { exited <- cmd.Wait() }()
	}
	deadline := time.After(3 * time.Minute)
	for range candidates {
		select {
		case err := <-exited:
			require.NoError(t, err, "a candidate process failed")
		case <-deadline:
			t.Fatal("the candidates did not all get their terms within 3 minutes")
		}
	}
	took := time.Since(start)

	var n, open, overlaps, pids int
	require.NoError(t, db.QueryRow(`SELECT count(*), count(*) FILTER (WHERE ended_at IS NULL), count(DISTINCT pid) FROM `+table).Scan(&n, &open, &pids))
	assert.Equal(t, candidates*terms, n, "terms recorded")
	assert.Zero(t, open, "terms without an end")
	assert.Equal(t, candidates, pids, "candidates elected")
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+table+` a JOIN `+table+` b ON a.id < b.id
		AND a.started_at < b.ended_at AND b.started_at < a.ended_at`).Scan(&overlaps))
	assert.Zero(t, overlaps, "overlapping terms")
	rows, err := db.Query(`SELECT token, waited_ms, extract(epoch FROM started_at - lag(ended_at) OVER (ORDER BY started_at)) * 1000
		FROM ` + table + ` ORDER BY started_at`)
	require.NoError(t, err)
	var tokens []int64
	var gaps []float64
	var maxWait int64
	for rows.Next() {
		var tok, waited int64
		var gap sql.NullFloat64
		require.NoError(t, rows.Scan(&tok, &waited, &gap))
		tokens = append(tokens, tok)
		maxWait = max(maxWait, waited)
		if gap.Valid {
			gaps = append(gaps, gap.Float64)
		}
	}
	require.NoError(t, rows.Err())
	assert.True(t, slices.IsSorted(tokens) && len(slices.Compact(slices.Clone(tokens))) == len(tokens), "tokens grow with the terms: %v", tokens)
	slices.Sort(gaps)
	require.NotEmpty(t, gaps)
	t.Logf("%d candidate processes, %d terms of 100ms in %v; longest campaign %dms; gap from one recorded end to the next start: median %.1fms, max %.1fms",
		candidates, n, took.Round(time.Millisecond), maxWait, gaps[len(gaps)/2], gaps[len(gaps)-1])
	assert.Less(t, maxWait, int64(60_000), "a candidate waited more than a minute for its term")
}

// StoppedLeader is the SIGSTOP test: a leader process of the test binary
// (TermChild) on url is frozen. The server ends its session at the TTL,
// and a candidate of this process, on db (which reaches the server
// directly, and has the fencing sequence), is elected: the target is the
// TTL plus 1s; the assertion allows 3s more for a loaded machine, and the
// test logs the number. Thawed, the old leader finds its context already
// cancelled, with ErrLockLost, and its fenced write refused.
func StoppedLeader(t *testing.T, db *sql.DB, url string) {
	t.Helper()
	table := "stopped_" + TableSuffix(t)
	_, err := db.Exec(`CREATE TABLE ` + table + ` (id int PRIMARY KEY, qty int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
		INSERT INTO ` + table + ` VALUES (1, 0, 0)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
	key := Uniq(t)
	const ttl = 2 * time.Second
	cmd := termChild("stopped", url, "TXLOCK_CHILD_KEY="+key, "TXLOCK_CHILD_TABLE="+table, "TXLOCK_TTL="+ttl.String())
	stdin, next := RunChild(t, cmd)
	line := next()
	tokenA, err := strconv.ParseInt(strings.TrimPrefix(line, "token "), 10, 64)
	require.NoError(t, err, line)
	leaderPID := HolderPID(t, db, txlock.StringKey(key))
	require.NotZero(t, leaderPID, "the leader's backend")
	time.Sleep(2 * ttl / 5) // a heartbeat or two

	require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
	frozen := time.Now()
	// The server ends the frozen leader's session TTL after its last
	// heartbeat left it idle in transaction, by the server's clock: how
	// long ago that was (a heartbeat every TTL/5, unless the leader was
	// paused before the freeze) gives the earliest election.
	idle := idleInTransaction(t, db, leaderPID)
	term, err := txlock.AcquireTerm(context.Background(), db, txlock.StringKey(key),
		txlock.WithTimeout(20*time.Second), txlock.WithRetry(txlock.ConstantBackoff{Interval: 20 * time.Millisecond}))
	require.NoError(t, err)
	took := time.Since(frozen)
	t.Logf("a candidate was elected %v after the leader froze, whose backend had been idle in transaction for %v (TTL %v; target TTL + 1s)",
		took.Round(time.Millisecond), idle.Round(time.Millisecond), ttl)
	assert.Less(t, took, ttl+4*time.Second)
	assert.GreaterOrEqual(t, took, ttl-idle, "elected before the TTL had passed since the frozen leader's last heartbeat")
	require.Greater(t, term.Token(), tokenA)
	ft := txlock.FencedTable{Name: table}
	_, err = ft.Update(term.Context(), db, term.Token(), []txlock.Col{{Name: "qty", Value: 42}}, []txlock.Col{{Name: "id", Value: 1}})
	require.NoError(t, err)

	// The instruction waits in the pipe, so that the first thing the thawed
	// leader does is read it and look at its context.
	_, err = io.WriteString(stdin, "check\n")
	require.NoError(t, err)
	require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
	assert.Equal(t, fmt.Sprintf("ended=true lost=true write=stale current=%d", term.Token()), next())
	assert.Equal(t, "lead lost=true", next())
	require.NoError(t, stdin.Close())
	require.NoError(t, cmd.Wait())

	var qty int
	var tok int64
	require.NoError(t, db.QueryRow(`SELECT qty, fence_token FROM `+table+` WHERE id = 1`).Scan(&qty, &tok))
	assert.Equal(t, 42, qty, "the new leader's write")
	assert.Equal(t, term.Token(), tok)
	require.NoError(t, term.Release(context.Background()))
}

// idleInTransaction returns how long pid's backend has been idle in
// transaction, by the server's clock, once it is (a statement it was
// running when its client froze still completes).
func idleInTransaction(t *testing.T, db *sql.DB, pid int) time.Duration {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var state string
		var secs float64
		err := db.QueryRow(`SELECT coalesce(state, ''), EXTRACT(epoch FROM clock_timestamp() - state_change)::float8 FROM pg_stat_activity WHERE pid = $1`, pid).Scan(&state, &secs)
		require.NoError(t, err, "the backend %d of the frozen leader", pid)
		if state == "idle in transaction" {
			return time.Duration(secs * float64(time.Second))
		}
		require.True(t, time.Now().Before(deadline), "the backend %d of the frozen leader is %q", pid, state)
		time.Sleep(5 * time.Millisecond)
	}
}

// TableSuffix returns the random part of Uniq, for a table name.
func TableSuffix(t *testing.T) string {
	u := Uniq(t)
	return u[strings.LastIndex(u, "/")+1:]
}
