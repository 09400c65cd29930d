// Package exampledb gives the example programs a database to run against:
// the one DATABASE_URL names, or else a throwaway PostgreSQL (and, when
// pgbouncer is installed, a PgBouncer in transaction mode in front of it)
// started from the locally installed binaries by the same harness the tests
// use, and removed again by Close. Main is the main function the example
// programs share.
package exampledb

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/txlock/txlock/internal/pgtest"
)

// ErrNoServer is what Start's error wraps when it could not start a
// PostgreSQL: the server binaries are missing, or they failed. Its text is
// in the line the program then prints on standard error, so that a test
// that runs the program as a process of its own can tell a machine without
// PostgreSQL from a broken example.
var ErrNoServer = errors.New("starting PostgreSQL (install the server binaries, or set DATABASE_URL)")

// Main runs an example program: run with a context that the first SIGINT
// or SIGTERM cancels, the command-line arguments and standard output. A
// second signal ends the program at once. If run returns an error, Main
// prints "name: error" to standard error and exits 1, or, if a signal came
// first, "name: interrupted: error" and exits 130; flag.ErrHelp (from -h)
// exits 0.
func Main(name string, run func(ctx context.Context, args []string, stdout io.Writer) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	// After the first signal, a second one ends the program at once.
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Stdout)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case interrupted:
		fmt.Fprintln(os.Stderr, name+": interrupted:", err)
		os.Exit(130)
	default:
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

// Servers is what the example runs against. Close stops whatever Start
// started; it is safe to call more than once.
type Servers struct {
	// URL is a connection string for PostgreSQL itself.
	URL string
	// BouncerURL is a connection string through PgBouncer in transaction
	// mode, or "" when there is none: DATABASE_URL is set without
	// PGBOUNCER_URL, or pgbouncer is not installed.
	BouncerURL string
	// BouncerMissing says why BouncerURL is empty.
	BouncerMissing string
	// Throwaway says that Start started the servers, DATABASE_URL being
	// unset, and that Close stops them.
	Throwaway bool

	cluster *pgtest.Cluster
	bouncer *pgtest.Bouncer
}

// Start returns the servers to use, and says on w what it started and how
// to point the example at a database of one's own. With DATABASE_URL set it
// starts nothing, and PGBOUNCER_URL, if set, names a PgBouncer in front of
// that database. Without it, it starts a PostgreSQL and, if wantBouncer,
// tries to start a PgBouncer. Its error wraps ErrNoServer.
func Start(w io.Writer, wantBouncer bool) (*Servers, error) {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		s := &Servers{URL: url, BouncerURL: os.Getenv("PGBOUNCER_URL")}
		if s.BouncerURL == "" {
			s.BouncerMissing = "PGBOUNCER_URL is not set"
		}
		fmt.Fprintln(w, "using the database in DATABASE_URL")
		return s, nil
	}
	fmt.Fprintln(w, "DATABASE_URL is not set: starting a throwaway PostgreSQL on 127.0.0.1 (set DATABASE_URL, and PGBOUNCER_URL, to use your own)")
	cluster, err := pgtest.StartCluster(pgtest.ClusterOptions{})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoServer, err)
	}
	s := &Servers{URL: cluster.URL() + "&default_query_exec_mode=exec", Throwaway: true, cluster: cluster}
	fmt.Fprintf(w, "  PostgreSQL on 127.0.0.1:%d\n", cluster.Port())
	if !wantBouncer {
		return s, nil
	}
	bouncer, err := pgtest.StartBouncer(cluster, pgtest.BouncerOptions{})
	if err != nil {
		s.BouncerMissing = err.Error()
		fmt.Fprintf(w, "  no PgBouncer: %v\n", err)
		return s, nil
	}
	s.bouncer = bouncer
	s.BouncerURL = bouncer.URL() + "&default_query_exec_mode=exec"
	fmt.Fprintf(w, "  PgBouncer (transaction mode) on 127.0.0.1:%d\n", bouncer.Port())
	return s, nil
}

// Close stops the servers Start started.
func (s *Servers) Close() error {
	var errs []error
	if s.bouncer != nil {
		errs = append(errs, s.bouncer.Close())
		s.bouncer = nil
	}
	if s.cluster != nil {
		errs = append(errs, s.cluster.Close())
		s.cluster = nil
	}
	return errors.Join(errs...)
}
