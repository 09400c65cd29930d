// Package pgtest runs throwaway PostgreSQL servers, hot standbys and
// PgBouncers for tests, from the locally installed binaries. Everything
// listens on 127.0.0.1 only and lives in temporary directories that are
// removed afterwards.
//
// A test binary that uses the shared servers (Postgres, PgBouncer, Standby)
// must tear them down through Main:
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
//
// Existing servers can be used instead of throwaway ones by setting
// TXLOCK_TEST_DATABASE_URL, TXLOCK_TEST_PGBOUNCER_URL together with
// TXLOCK_TEST_PGBOUNCER_ADMIN_URL, and TXLOCK_TEST_STANDBY_URL (the
// program in pgdocker sets TXLOCK_TEST_DATABASE_URL to a PostgreSQL in a
// Docker container). When no server can be had, tests are skipped, unless
// the environment variable CI is non-empty: then they fail.
//
// When the process runs as root, the servers run as the user "nobody",
// because PostgreSQL and PgBouncer refuse to run as root.
package pgtest

import (
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
)

// Environment variables understood by this package.
const (
	envDatabaseURL     = "TXLOCK_TEST_DATABASE_URL"
	envPgBouncerURL    = "TXLOCK_TEST_PGBOUNCER_URL"
	envPgBouncerAdmin  = "TXLOCK_TEST_PGBOUNCER_ADMIN_URL"
	envStandbyURL      = "TXLOCK_TEST_STANDBY_URL"
	envPGBinDir        = "TXLOCK_TEST_PG_BINDIR"
	envPgBouncerBin    = "TXLOCK_TEST_PGBOUNCER"
	envCI              = "CI"
	sharedBouncerPool  = 5
	mainMissingMessage = "pgtest: shared test servers need TestMain to call pgtest.Main, e.g. func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }"
)

// lazy is a value created once on first use; a failure is remembered and
// reported to every later caller.
type lazy[T any] struct {
	done bool
	val  T
	err  error
}

// shared holds the servers shared by all tests of one test binary.
var shared struct {
	mu       sync.Mutex
	main     bool // Main is running
	tornDown bool // Main has closed everything
	cluster  lazy[*Cluster]
	bouncer  lazy[*Bouncer]
	standby  lazy[*Cluster]
}

// Main runs the tests and then closes every shared server that was started,
// returning the exit code for os.Exit. It also closes them, and exits
// non-zero, when the process receives SIGINT or SIGTERM. Use it as
//
//	func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }
func Main(m *testing.M) int {
	shared.mu.Lock()
	shared.main = true
	shared.mu.Unlock()

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	stop := make(chan struct{})
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		select {
		case sig := <-sigs:
			fmt.Fprintf(os.Stderr, "pgtest: received %v, closing the shared test servers\n", sig)
			closeShared()
			code := 1
			if s, ok := sig.(syscall.Signal); ok {
				code = 128 + int(s)
			}
			os.Exit(code)
		case <-stop:
		}
	}()

	code := m.Run()

	signal.Stop(sigs)
	close(stop)
	<-handled
	if err := closeShared(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

// closeShared closes every shared server, dependents first.
func closeShared() error {
	shared.mu.Lock()
	defer shared.mu.Unlock()
	shared.tornDown = true
	var errs []error
	if b := shared.bouncer.val; b != nil {
		errs = append(errs, b.Close())
	}
	if s := shared.standby.val; s != nil {
		errs = append(errs, s.Close())
	}
	if c := shared.cluster.val; c != nil {
		errs = append(errs, c.Close())
	}
	for _, err := range errs {
		if err != nil {
			return fmt.Errorf("pgtest: closing the shared test servers: %w", err)
		}
	}
	return nil
}

// sharedReady reports whether shared servers may be started; the caller
// holds shared.mu.
func sharedReady(t testing.TB) bool {
	t.Helper()
	if !shared.main {
		t.Fatal(mainMissingMessage)
		return false
	}
	if shared.tornDown {
		t.Fatal("pgtest: the shared test servers have already been closed")
		return false
	}
	return true
}

// sharedClusterLocked returns the shared throwaway cluster, starting it on
// first use; the caller holds shared.mu.
func sharedClusterLocked() (*Cluster, error) {
	if !shared.cluster.done {
		shared.cluster.done = true
		shared.cluster.val, shared.cluster.err = StartCluster(ClusterOptions{})
	}
	return shared.cluster.val, shared.cluster.err
}

// ownClusterLocked reports whether the shared PostgreSQL is a throwaway
// cluster of this package, which PgBouncer and Standby can build on.
func ownClusterLocked() bool {
	return os.Getenv(envDatabaseURL) == ""
}

// Postgres returns the URL of a PostgreSQL server shared by all tests of the
// binary: $TXLOCK_TEST_DATABASE_URL if set, otherwise a throwaway cluster
// started on first use. If no server can be had the test is skipped, or
// failed when $CI is set (see Unavailable).
func Postgres(t testing.TB) string {
	t.Helper()
	if url := os.Getenv(envDatabaseURL); url != "" {
		return url
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !sharedReady(t) {
		return ""
	}
	c, err := sharedClusterLocked()
	if err != nil {
		Unavailable(t, "no throwaway PostgreSQL (install the PostgreSQL server binaries, or set %s to a PostgreSQL URL): %v", envDatabaseURL, err)
		return ""
	}
	return c.URL()
}

// PgBouncer returns the URLs of a PgBouncer in transaction pool mode and of
// its admin console, shared by all tests of the binary:
// $TXLOCK_TEST_PGBOUNCER_URL and $TXLOCK_TEST_PGBOUNCER_ADMIN_URL if set,
// otherwise a throwaway Bouncer (pool size 5) in front of the shared
// throwaway cluster, started on first use. If no PgBouncer can be had the
// test is skipped, or failed when $CI is set (see Unavailable).
func PgBouncer(t testing.TB) (url, adminURL string) {
	t.Helper()
	if url := os.Getenv(envPgBouncerURL); url != "" {
		admin := os.Getenv(envPgBouncerAdmin)
		if admin == "" {
			Unavailable(t, "%s is set but %s is not; set it to the URL of the PgBouncer admin console (database pgbouncer)", envPgBouncerURL, envPgBouncerAdmin)
			return "", ""
		}
		return url, admin
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !sharedReady(t) {
		return "", ""
	}
	if !ownClusterLocked() {
		Unavailable(t, "no PgBouncer in front of the external PostgreSQL: set %s and %s", envPgBouncerURL, envPgBouncerAdmin)
		return "", ""
	}
	if !shared.bouncer.done {
		c, err := sharedClusterLocked()
		shared.bouncer.done = true
		if err != nil {
			shared.bouncer.err = err
		} else {
			shared.bouncer.val, shared.bouncer.err = StartBouncer(c, BouncerOptions{PoolSize: sharedBouncerPool})
		}
	}
	if err := shared.bouncer.err; err != nil {
		Unavailable(t, "no throwaway PgBouncer (install PostgreSQL and PgBouncer, or set %s and %s): %v", envPgBouncerURL, envPgBouncerAdmin, err)
		return "", ""
	}
	return shared.bouncer.val.URL(), shared.bouncer.val.AdminURL()
}

// Standby returns the URL of a hot standby of the server returned by
// Postgres, shared by all tests of the binary: $TXLOCK_TEST_STANDBY_URL if
// set, otherwise a throwaway standby of the shared throwaway cluster, started
// on first use. If no standby can be had the test is skipped, or failed when
// $CI is set (see Unavailable).
func Standby(t testing.TB) string {
	t.Helper()
	if url := os.Getenv(envStandbyURL); url != "" {
		return url
	}
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if !sharedReady(t) {
		return ""
	}
	if !ownClusterLocked() {
		Unavailable(t, "no standby of the external PostgreSQL: set %s to the URL of a hot standby of it", envStandbyURL)
		return ""
	}
	if !shared.standby.done {
		c, err := sharedClusterLocked()
		shared.standby.done = true
		if err != nil {
			shared.standby.err = err
		} else {
			shared.standby.val, shared.standby.err = c.StartStandby()
		}
	}
	if err := shared.standby.err; err != nil {
		Unavailable(t, "no throwaway hot standby (install the PostgreSQL server binaries, or set %s and %s): %v", envDatabaseURL, envStandbyURL, err)
		return ""
	}
	return shared.standby.val.URL()
}

// NewCluster starts a PostgreSQL cluster dedicated to the test, closed when
// the test ends. If it cannot be started the test is skipped, or failed when
// $CI is set (see Unavailable).
func NewCluster(t testing.TB, opts ClusterOptions) *Cluster {
	t.Helper()
	c, err := StartCluster(opts)
	if err != nil {
		Unavailable(t, "no throwaway PostgreSQL (install the PostgreSQL server binaries, or point %s at their directory): %v", envPGBinDir, err)
		return nil
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	})
	return c
}

// NewBouncer starts a PgBouncer dedicated to the test in front of upstream,
// closed when the test ends. If it cannot be started the test is skipped, or
// failed when $CI is set (see Unavailable).
func NewBouncer(t testing.TB, upstream *Cluster, opts BouncerOptions) *Bouncer {
	t.Helper()
	b, err := StartBouncer(upstream, opts)
	if err != nil {
		Unavailable(t, "no throwaway PgBouncer (install PgBouncer, or set %s to the pgbouncer binary): %v", envPgBouncerBin, err)
		return nil
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Error(err)
		}
	})
	return b
}

// Unavailable reports that a test cannot get the server it needs. The
// message should name the environment variable that provides one. When the
// environment variable CI is non-empty the test fails, so a misconfigured CI
// never silently skips; otherwise it is skipped.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv(envCI) != "" {
		t.Fatalf("pgtest: %s (failing instead of skipping because CI is set)", msg)
		return
	}
	t.Skipf("pgtest: %s", msg)
}

// Psql returns the path of the psql client beside the PostgreSQL server
// binaries the harness runs, for tests that take locks by hand as an
// operator would. If there is none the test is skipped, or failed when $CI
// is set (see Unavailable).
func Psql(t testing.TB) string {
	t.Helper()
	// The server binaries of some packages come without psql: any psql on
	// PATH speaks to every server version the tests run.
	dir, err := findPostgresBin()
	if err == nil {
		p := filepath.Join(dir, "psql")
		if _, err = os.Stat(p); err == nil {
			return p
		}
	}
	p, perr := exec.LookPath("psql")
	if perr == nil {
		return p
	}
	Unavailable(t, "no psql beside the PostgreSQL server binaries or on PATH (install the PostgreSQL client): %v; %v", err, perr)
	return ""
}
