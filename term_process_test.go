package txlock_test

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
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// Terms across processes: the test binary re-executes itself as candidate
// processes, which get the server's URL from their environment and never
// start servers of their own: init hands them to termChild before
// TestMain, and so before the harness, runs.

const termChildEnv = "TXLOCK_TERM_CHILD"

func init() {
	if mode := os.Getenv(termChildEnv); mode != "" {
		os.Exit(termChild(mode))
	}
}

// termChild runs one candidate process: "candidate" leads TXLOCK_TERMS
// terms of TXLOCK_HOLD each and records them; "stopped" leads one term,
// which its parent freezes, and reports what it finds when it is thawed.
func termChild(mode string) int {
	db, err := sql.Open("pgx", os.Getenv("TXLOCK_CHILD_URL"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer db.Close()
	db.SetMaxOpenConns(4)
	key := txlock.StringKey(os.Getenv("TXLOCK_CHILD_KEY"))
	table := os.Getenv("TXLOCK_CHILD_TABLE")
	switch mode {
	case "candidate":
		err = candidate(db, key, table)
	case "stopped":
		err = stoppedLeader(db, key, table)
	default:
		err = fmt.Errorf("unknown %s %q", termChildEnv, mode)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "candidate %d: %v\n", os.Getpid(), err)
		return 1
	}
	return 0
}

// candidate leads its terms one after the other, each recorded in table
// with the server's clock_timestamp() at its start and end, and pauses
// after each so that the other candidates can win the next.
func candidate(db *sql.DB, key txlock.Key, table string) error {
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
		err := txlock.Lead(ctx, db, key, func(ctx context.Context, term *txlock.Term) error {
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
		}, txlock.WithHeartbeat(steadyBeat)) // a loss would fail the process: no pause of a loaded machine may end a term
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
func stoppedLeader(db *sql.DB, key txlock.Key, table string) error {
	ttl, err := time.ParseDuration(os.Getenv("TXLOCK_TTL"))
	if err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	ft := txlock.FencedTable{Name: table}
	err = txlock.Lead(context.Background(), db, key, func(ctx context.Context, term *txlock.Term) error {
		fmt.Printf("token %d\n", term.Token())
		if !in.Scan() { // frozen here
			return errors.New("no instruction")
		}
		// The first thing the thawed holder does is look at its context.
		ended := ctx.Err() != nil
		cause := context.Cause(ctx)
		_, err := ft.Update(context.Background(), db, term.Token(), []txlock.Col{{Name: "qty", Value: 49}}, []txlock.Col{{Name: "id", Value: 1}})
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

// childURL is the URL a candidate process connects to: the test
// PostgreSQL, or with via "PgBouncer" the test PgBouncer, in an exec mode
// that prepares nothing.
func childURL(t *testing.T, via string) string {
	t.Helper()
	if via != "PgBouncer" {
		return pgtest.Postgres(t)
	}
	url, _ := pgtest.PgBouncer(t)
	return url + "&default_query_exec_mode=exec"
}

// startChild starts the test binary as a candidate process in mode.
func startChild(t *testing.T, mode, url string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), append([]string{termChildEnv + "=" + mode, "TXLOCK_CHILD_URL=" + url}, env...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

// The exclusion test: 16 candidate processes lead two terms each, one
// after the other, each recorded with the server's clock_timestamp(). No
// two recorded terms may overlap, tokens must grow with the terms, and
// every candidate must get its terms while the others keep campaigning.
func TestTermExclusionAcrossProcesses(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			db := termDB(t)
			url := childURL(t, via)
			table := "terms_" + tableSuffix(t)
			_, err := db.Exec(`CREATE TABLE ` + table + ` (id bigserial PRIMARY KEY, pid int NOT NULL, token bigint NOT NULL, waited_ms bigint NOT NULL,
				started_at timestamptz NOT NULL, ended_at timestamptz)`)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
			key := uniq(t)
			const candidates, terms = 16, 2
			var cmds []*exec.Cmd
			start := time.Now()
			for range candidates {
				cmd := startChild(t, "candidate", url, "TXLOCK_CHILD_KEY="+key, "TXLOCK_CHILD_TABLE="+table,
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
		})
	}
}

// The SIGSTOP test: a leader process is frozen. The server ends its session
// at the TTL, and a candidate is elected: the target is the TTL
// plus 1s; the assertion allows 3s more for a loaded machine, and the test
// logs the number. Thawed, the old leader finds its context already
// cancelled, with ErrLockLost, and its fenced write refused.
func TestTermStoppedLeader(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			db := termDB(t)
			url := childURL(t, via)
			table := "stopped_" + tableSuffix(t)
			_, err := db.Exec(`CREATE TABLE ` + table + ` (id int PRIMARY KEY, qty int NOT NULL, fence_token bigint NOT NULL DEFAULT 0);
				INSERT INTO ` + table + ` VALUES (1, 0, 0)`)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = db.Exec(`DROP TABLE ` + table) })
			key := uniq(t)
			const ttl = 2 * time.Second
			cmd := startChild(t, "stopped", url, "TXLOCK_CHILD_KEY="+key, "TXLOCK_CHILD_TABLE="+table, "TXLOCK_TTL="+ttl.String())
			stdin, next := locktest.RunChild(t, cmd)
			line := next()
			tokenA, err := strconv.ParseInt(strings.TrimPrefix(line, "token "), 10, 64)
			require.NoError(t, err, line)
			leaderPID := termPID(t, db, txlock.StringKey(key))
			require.NotZero(t, leaderPID, "the leader's backend")
			time.Sleep(2 * ttl / 5) // a heartbeat or two

			require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
			frozen := time.Now()
			// The server ends the frozen leader's session TTL after its last
			// heartbeat left it idle in transaction, by the server's clock:
			// how long ago that was (a heartbeat every TTL/5, unless the
			// leader was paused before the freeze) gives the earliest
			// election.
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

			// The instruction waits in the pipe, so that the first thing the
			// thawed leader does is read it and look at its context.
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
		})
	}
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

// tableSuffix returns the random part of uniq, for a table name.
func tableSuffix(t *testing.T) string {
	u := uniq(t)
	return u[strings.LastIndex(u, "/")+1:]
}
