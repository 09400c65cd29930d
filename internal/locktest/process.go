package locktest

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

// RunChild starts cmd, a child process of the test binary, with pipes to
// its stdin and from its stdout, and stops it (thawed, if frozen) when the
// test ends. next returns its next line of output, and fails the test if
// there is none.
func RunChild(t testing.TB, cmd *exec.Cmd) (stdin io.WriteCloser, next func() string) {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := bufio.NewScanner(stdout)
	return stdin, func() string {
		require.True(t, lines.Scan(), "the child's output ended: %v", lines.Err())
		return lines.Text()
	}
}

// SemaphoreChildEnv, set in a test binary's environment, makes it a
// semaphore holder process: the binary's init calls SemaphoreChild and
// exits with its result, before TestMain starts any server.
const SemaphoreChildEnv = "TXLOCK_SEM_CHILD"

// SemaphoreOpener opens a driver's pool of at most workers connections on
// url, and returns its WithSemaphore and a function that closes the pool.
type SemaphoreOpener func(url string, workers int) (SemaphoreFunc, func(), error)

// SemaphoreChild is the body of a holder process that
// SemaphoresAcrossProcesses starts. It runs TXLOCK_SEM_WORKERS workers on
// the semaphore TXLOCK_CHILD_KEY of TXLOCK_SEM_N slots, recording each hold
// in the Runs table TXLOCK_CHILD_TABLE, from a "go" on its stdin until
// TXLOCK_SEM_FOR has passed; then it prints "done". It returns the
// process's exit code.
func SemaphoreChild(open SemaphoreOpener) int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "semaphore child %d: %v\n", os.Getpid(), err)
		return 1
	}
	workers, _ := strconv.Atoi(os.Getenv("TXLOCK_SEM_WORKERS"))
	n, _ := strconv.Atoi(os.Getenv("TXLOCK_SEM_N"))
	d, err := time.ParseDuration(os.Getenv("TXLOCK_SEM_FOR"))
	if err != nil {
		return fail(err)
	}
	with, closePool, err := open(os.Getenv("TXLOCK_CHILD_URL"), workers)
	if err != nil {
		return fail(err)
	}
	defer closePool()
	key := txlock.StringKey(os.Getenv("TXLOCK_CHILD_KEY"))
	runs := Runs{Table: os.Getenv("TXLOCK_CHILD_TABLE")}
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
				err := with(context.Background(), key, n, func(ctx context.Context, tx Tx) error {
					l, _ := txlock.LockFromContext(ctx)
					return runs.Run(ctx, tx, who, l.Slot, 5*time.Millisecond)
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

// SemaphoresAcrossProcesses starts five holder processes of the test
// binary (SemaphoreChild), three workers each on url, which share a
// semaphore of 3 slots for two seconds. It checks, through admin (the
// server reached directly): at most 3 inside at once by the server's
// clock, and 3 reached; never two in a slot; and every process and every
// slot gets at least a quarter of its fair share.
func SemaphoresAcrossProcesses(t *testing.T, admin *sql.DB, url string) {
	t.Helper()
	const procs, workers, n = 5, 3, 3
	runs := NewRuns(t, admin, "txlock_sem_procs")
	key := Uniq(t)
	var starts []func() string
	var stdins []io.WriteCloser
	for range procs {
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), SemaphoreChildEnv+"=1", "TXLOCK_CHILD_URL="+url,
			"TXLOCK_CHILD_KEY="+key, "TXLOCK_CHILD_TABLE="+runs.Table,
			"TXLOCK_SEM_WORKERS="+strconv.Itoa(workers), "TXLOCK_SEM_N="+strconv.Itoa(n), "TXLOCK_SEM_FOR=2s")
		cmd.Stderr = os.Stderr
		stdin, next := RunChild(t, cmd)
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
}
