//go:build docker

package pgtest

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

// With the docker build tag, TXLOCK_TEST_DOCKER=1 makes Postgres run the
// postgres:15 image instead of the locally installed binaries. PgBouncer and
// Standby then need their URLs from the environment.
func init() {
	externalProvider = startDockerPostgres
}

// dockerExpiry is a hard limit after which the container is removed even if
// the test binary never cleans up.
const dockerExpiry = 30 * time.Minute

func startDockerPostgres() (externalServer, error) {
	pool, err := dockertest.NewPool("")
	if err != nil {
		return externalServer{}, fmt.Errorf("connecting to docker: %w", err)
	}
	if err := pool.Client.Ping(); err != nil {
		return externalServer{}, fmt.Errorf("pinging docker: %w", err)
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
		return externalServer{}, fmt.Errorf("starting postgres:15: %w", err)
	}
	if err := res.Expire(uint(dockerExpiry / time.Second)); err != nil {
		pool.Purge(res)
		return externalServer{}, fmt.Errorf("setting the container expiry: %w", err)
	}
	_, port, err := net.SplitHostPort(res.GetHostPort("5432/tcp"))
	if err != nil {
		pool.Purge(res)
		return externalServer{}, fmt.Errorf("finding the container's port: %w", err)
	}
	url := fmt.Sprintf("postgres://%s@127.0.0.1:%s/postgres?sslmode=disable", superuser, port)
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
		pool.Purge(res)
		return externalServer{}, fmt.Errorf("waiting for the postgres:15 container: %w", err)
	}
	return externalServer{url: url, close: func() error { return pool.Purge(res) }}, nil
}
