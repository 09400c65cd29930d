// Package exampletest runs an example program as a process of its own for
// its tests: it builds the program once per test binary, gives it an
// environment of the test's choosing, and skips the test (fails it when CI
// is set) when the program could not start a PostgreSQL.
//
// A test binary that uses Build runs its tests through Main:
//
//	func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }
package exampletest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/txlock/txlock/examples/internal/exampledb"
	"github.com/txlock/txlock/internal/pgtest"
)

var built struct {
	dir  string // made by Main
	once sync.Once
	bin  string
	err  error
}

// Main runs the tests through pgtest.Main, which closes the shared test
// servers, with a temporary directory for Build that it removes afterwards.
// It returns the exit code for os.Exit.
func Main(m *testing.M) int {
	dir, err := os.MkdirTemp("", "txlock-example-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	built.dir = dir
	code := pgtest.Main(m)
	os.RemoveAll(dir)
	return code
}

// Build compiles the example in the test's working directory, its
// package's, once for all tests, with the race detector if this test binary
// has it, and returns the program's path.
func Build(t testing.TB) string {
	t.Helper()
	built.once.Do(func() {
		if built.dir == "" {
			built.err = fmt.Errorf("exampletest: Build needs TestMain to call exampletest.Main, e.g. func TestMain(m *testing.M) { os.Exit(exampletest.Main(m)) }")
			return
		}
		wd, err := os.Getwd()
		if err != nil {
			built.err = err
			return
		}
		bin := filepath.Join(built.dir, filepath.Base(wd))
		args := []string{"build", "-o", bin}
		if raceEnabled() {
			args = append(args, "-race")
		}
		if out, err := exec.Command("go", append(args, ".")...).CombinedOutput(); err != nil {
			built.err = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		built.bin = bin
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin
}

func raceEnabled() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// UseTestServers points an example run in the test's own process at the
// test suite's servers when TXLOCK_TEST_DATABASE_URL (and
// TXLOCK_TEST_PGBOUNCER_URL) names them, and otherwise lets it start its
// own: a DATABASE_URL of the developer's own is never touched by the tests.
func UseTestServers(t testing.TB) {
	t.Setenv("DATABASE_URL", os.Getenv("TXLOCK_TEST_DATABASE_URL"))
	t.Setenv("PGBOUNCER_URL", os.Getenv("TXLOCK_TEST_PGBOUNCER_URL"))
}

// Env is the test's environment without DATABASE_URL and PGBOUNCER_URL, so
// that the example starts servers of its own, or with DATABASE_URL set to
// databaseURL if it is not empty.
func Env(databaseURL string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "PGBOUNCER_URL=") {
			env = append(env, kv)
		}
	}
	if databaseURL != "" {
		env = append(env, "DATABASE_URL="+databaseURL)
	}
	return env
}

// Run runs the example bin with args and returns its standard output and
// its pid, failing the test unless it exits 0. Without databaseURL the
// example starts its own PostgreSQL; if it cannot, the test is skipped
// (failed when CI is set). After two minutes it is interrupted, so that it
// stops what it started.
func Run(t testing.TB, bin, databaseURL string, args ...string) (stdout string, pid int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) } // let it stop what it started
	cmd.WaitDelay = 15 * time.Second
	cmd.Env = Env(databaseURL)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s %s: %v in %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, time.Since(start).Round(time.Millisecond), out.String(), stderr.String())
	if err != nil {
		SkipIfNoPostgres(t, databaseURL, stderr.String())
		t.Fatalf("the example failed: %v", err)
	}
	return out.String(), cmd.Process.Pid
}

// SkipIfNoPostgres skips the test (fails it when CI is set) if the
// example, run without databaseURL, said on stderr that it could not start
// a PostgreSQL: that it failed with exampledb.ErrNoServer.
func SkipIfNoPostgres(t testing.TB, databaseURL, stderr string) {
	t.Helper()
	if databaseURL == "" && strings.Contains(stderr, exampledb.ErrNoServer.Error()) {
		pgtest.Unavailable(t, "the example could not start a throwaway PostgreSQL (install the PostgreSQL server binaries, or point TXLOCK_TEST_PG_BINDIR at them): %s", strings.TrimSpace(stderr))
	}
}

// CheckRefused runs the example bin with args, which it must refuse: it
// must fail, with output naming want, before it starts any server.
func CheckRefused(t testing.TB, bin, want string, args ...string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = Env("")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), want) || strings.Contains(string(out), "PostgreSQL on") {
		t.Errorf("%v: err %v, output %q; want a failure naming %q before any server starts", args, err, out, want)
	}
}

var postgresLine = regexp.MustCompile(`(?m)^  PostgreSQL on 127\.0\.0\.1:(\d+)$`)

// CheckPostgresGone checks that the throwaway PostgreSQL whose port the
// example's output out names no longer listens.
func CheckPostgresGone(t testing.TB, out string) {
	t.Helper()
	m := postgresLine.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the output does not say which port the throwaway PostgreSQL had")
	}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:"+m[1], time.Second); err == nil {
		c.Close()
		t.Errorf("something still listens on port %s, where the program's PostgreSQL was", m[1])
	}
}

// Buffer is an output that one goroutine can read while another writes it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p to the buffer.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns what has been written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
