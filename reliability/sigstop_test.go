package reliability_test

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/reliability/internal/checker"
)

// holderEnv makes the test binary, re-executed by TestFaultSIGSTOP, act as a
// lock holder instead of running tests. Its value is
// "<connection URL> <key name> <hold bound>".
const holderEnv = "TXLOCK_RELIABILITY_HOLDER"

// holderMain takes the lock with WithMaxHold, writes "holding <pid>" to
// stdout, and waits inside fn until its context ends. Then it writes
// "result <class>" and exits.
func holderMain() int {
	f := strings.Fields(os.Getenv(holderEnv))
	if len(f) != 3 {
		fmt.Fprintf(os.Stderr, "%s: want \"url key hold\", got %q\n", holderEnv, os.Getenv(holderEnv))
		return 2
	}
	hold, err := time.ParseDuration(f[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	db, err := sql.Open("pgx", f[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer db.Close()
	err = txlock.WithLock(context.Background(), db, txlock.StringKey(f[1]), func(ctx context.Context, tx *sql.Tx) error {
		var pid int
		if err := tx.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
			return err
		}
		fmt.Printf("holding %d\n", pid)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Minute):
			return nil
		}
	}, txlock.WithMaxHold(hold))
	fmt.Printf("result %s\n", checker.Classify(err))
	return 0
}

// TestFaultSIGSTOP freezes a holder process with SIGSTOP. The server ends
// its session when the WithMaxHold bound passes, so the lock is free at
// about the bound (within the bound plus two seconds, which leaves a loaded
// machine room, while a lock kept by the frozen holder is never free), and
// the next holder proceeds. After SIGCONT the
// frozen holder learns that it lost the lock: ErrHoldTimeout.
func TestFaultSIGSTOP(t *testing.T) {
	const bound = time.Second
	for _, path := range []string{"direct", "pgbouncer"} {
		t.Run(path, func(t *testing.T) {
			pg, dsn := paths(t, path)
			leaks := newLeaks()
			admin := pool(t, pg, 2)
			db := pool(t, dsn, 2)
			name := fmt.Sprintf("sigstop/%s/%d", path, time.Now().UnixNano())
			key := txlock.StringKey(name)

			cmd := exec.Command(os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s", holderEnv, dsn, name, bound))
			cmd.Stderr = os.Stderr
			out, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			t.Cleanup(func() {
				_ = cmd.Process.Signal(syscall.SIGCONT)
				_ = cmd.Process.Kill()
				_ = cmd.Wait()
			})
			lines := bufio.NewScanner(out)
			require.True(t, lines.Scan(), "the holder process said nothing: %v", lines.Err())
			pid, err := strconv.Atoi(strings.TrimPrefix(lines.Text(), "holding "))
			require.NoError(t, err, "holder said %q", lines.Text())

			require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
			stopped := time.Now()
			pids, err := checker.HeldBy(context.Background(), admin, key)
			require.NoError(t, err)
			if path == "direct" {
				require.Equal(t, []int{pid}, pids, "the frozen process holds the lock")
			} else {
				require.Len(t, pids, 1, "the frozen process holds the lock")
			}

			// The next holder gets the lock within the bound plus two seconds.
			var waited time.Duration
			err = txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
				waited = time.Since(stopped)
				return nil
			}, txlock.WithTimeout(bound+2*time.Second))
			require.NoError(t, err, "the next holder did not get the lock within the bound plus two seconds")
			t.Logf("%s: lock free %v after SIGSTOP (bound %v)", path, waited.Round(time.Millisecond), bound)
			assert.Less(t, waited, bound+2*time.Second)

			require.NoError(t, cmd.Process.Signal(syscall.SIGCONT))
			require.True(t, lines.Scan(), "the holder process said nothing after SIGCONT: %v", lines.Err())
			assert.Equal(t, "result "+checker.ClassHoldTimeout, lines.Text(), "the frozen holder must learn it lost the lock")
			require.NoError(t, cmd.Wait())
			finish(t, nil, leaks, admin, db)
			figures(t, "path=%s bound=%v released_after=%v", path, bound, waited.Round(time.Millisecond))
		})
	}
}
