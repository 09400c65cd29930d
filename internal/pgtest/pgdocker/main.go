// Command pgdocker runs a command against PostgreSQL 15 in a Docker
// container, for a machine with Docker but without the PostgreSQL server
// binaries. It starts the postgres:15 image on 127.0.0.1, waits until the
// server answers, and runs the command with TXLOCK_TEST_DATABASE_URL set to
// it, which the test harness (internal/pgtest) then uses instead of starting
// a cluster. When the command ends it removes the container and exits with
// the command's status. From the repository root:
//
//	go run ./internal/pgtest/pgdocker go test -race -count=1 ./...
//
// Without a command it prints TXLOCK_TEST_DATABASE_URL=… and keeps the
// container until it is interrupted.
//
// Only the shared server comes from the container. Tests that need a
// PgBouncer or a standby in front of it skip (or fail, when CI is set)
// unless TXLOCK_TEST_PGBOUNCER_URL, TXLOCK_TEST_PGBOUNCER_ADMIN_URL and
// TXLOCK_TEST_STANDBY_URL are set too, and tests that start servers of
// their own still need the local binaries. Docker removes the container
// after two hours even if this program dies first.
//
// pgdocker is a module of its own, so that dockertest and its dependencies
// stay out of txlock's module graph.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

const (
	envDatabaseURL = "TXLOCK_TEST_DATABASE_URL"
	// superuser is the role of the harness's own clusters.
	superuser = "txlock"
	// expiry is a hard limit after which Docker removes the container.
	expiry = 2 * time.Hour
	// readyTimeout bounds the wait for the server to answer.
	readyTimeout = time.Minute
)

func main() { os.Exit(run(os.Args[1:])) }

// run starts the container, runs args (or waits for a signal when there
// are none), removes the container, and returns the exit code.
func run(args []string) int {
	url, purge, err := startPostgres()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgdocker:", err)
		return 1
	}
	defer func() {
		if err := purge(); err != nil {
			fmt.Fprintln(os.Stderr, "pgdocker: removing the container:", err)
		}
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	if len(args) == 0 {
		fmt.Printf("%s=%s\n", envDatabaseURL, url)
		fmt.Fprintln(os.Stderr, "pgdocker: interrupt to remove the container")
		<-sigs
		return 0
	}
	fmt.Fprintf(os.Stderr, "pgdocker: %s=%s\n", envDatabaseURL, url)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), envDatabaseURL+"="+url)
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "pgdocker:", err)
		return 1
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case sig := <-sigs:
			_ = cmd.Process.Signal(sig)
		case err := <-done:
			var ee *exec.ExitError
			if errors.As(err, &ee) && ee.ExitCode() > 0 {
				return ee.ExitCode()
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "pgdocker:", err)
				return 1
			}
			return 0
		}
	}
}

// startPostgres runs the postgres:15 image with the settings the harness's
// own clusters have, and returns its URL once it answers, and the function
// that removes it.
func startPostgres() (url string, purge func() error, err error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return "", nil, fmt.Errorf("connecting to docker: %w", err)
	}
	if err := pool.Client.Ping(); err != nil {
		return "", nil, fmt.Errorf("pinging docker: %w", err)
	}
	pool.MaxWait = readyTimeout
	res, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: "postgres",
		Tag:        "15",
		Env: []string{
			"POSTGRES_USER=" + superuser,
			"POSTGRES_DB=postgres",
			"POSTGRES_HOST_AUTH_METHOD=trust",
		},
		Cmd: []string{
			"postgres",
			"-c", "fsync=on",
			"-c", "max_connections=200",
			"-c", "wal_level=replica",
			"-c", "max_wal_senders=5",
			"-c", "hot_standby=on",
		},
		ExposedPorts: []string{"5432/tcp"},
		PortBindings: map[docker.Port][]docker.PortBinding{
			"5432/tcp": {{HostIP: "127.0.0.1", HostPort: ""}},
		},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return "", nil, fmt.Errorf("starting postgres:15: %w", err)
	}
	purge = func() error { return pool.Purge(res) }
	if err := res.Expire(uint(expiry / time.Second)); err != nil {
		return "", nil, errors.Join(fmt.Errorf("setting the container expiry: %w", err), purge())
	}
	_, port, err := net.SplitHostPort(res.GetHostPort("5432/tcp"))
	if err != nil {
		return "", nil, errors.Join(fmt.Errorf("finding the container's port: %w", err), purge())
	}
	url = fmt.Sprintf("postgres://%s@127.0.0.1:%s/postgres?sslmode=disable", superuser, port)
	err = pool.Retry(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(context.Background())
		return conn.Ping(ctx)
	})
	if err != nil {
		return "", nil, errors.Join(fmt.Errorf("waiting for the postgres:15 container: %w", err), purge())
	}
	return url, purge, nil
}
