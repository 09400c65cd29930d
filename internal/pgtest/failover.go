package pgtest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Failover: a primary with a synchronous standby, and the promotion of the
// standby once the primary is stopped (Stop("immediate") is a crash).

// syncTimeout bounds how long StartSyncStandby waits for the primary to
// report the new standby as synchronous, and Promote for the promotion.
const syncTimeout = time.Minute

// StartSyncStandby starts a hot standby of c as StartStandby does, and makes
// it c's synchronous standby: it sets synchronous_standby_names on c to '*'
// (ALTER SYSTEM, then a reload) and waits until c's pg_stat_replication
// reports a streaming standby whose sync_state is "sync". From then on, with
// synchronous_commit on (the default), a commit on c returns only once the
// standby has flushed it, and a commit waits while no standby is connected.
// The setting is made after the base backup, so the standby does not
// inherit it: once promoted, it commits without waiting for a standby of its
// own. Since '*' names any standby, a later StartStandby of c is a candidate
// too.
func (c *Cluster) StartSyncStandby() (*Cluster, error) {
	s, err := c.StartStandby()
	if err != nil {
		return nil, err
	}
	if err := c.makeSynchronous(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// makeSynchronous sets synchronous_standby_names on c and waits until a
// standby is synchronous.
func (c *Cluster) makeSynchronous() error {
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("pgtest: connecting to the primary on port %d: %w", c.port, err)
	}
	defer conn.Close(context.Background())
	for _, stmt := range []string{"ALTER SYSTEM SET synchronous_standby_names = '*'", "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("pgtest: %s on the primary on port %d: %w", stmt, c.port, err)
		}
	}
	var last string
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state = 'sync'`,
			pgx.QueryExecModeSimpleProtocol).Scan(&n)
		if err == nil && n > 0 {
			return nil
		}
		if err != nil {
			last = err.Error()
		} else {
			last = "no streaming standby with sync_state sync"
		}
		select {
		case <-ctx.Done():
			return withLog(fmt.Errorf("pgtest: the standby of port %d did not become synchronous within %v: %s", c.port, syncTimeout, last), c.logPath)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Promote promotes c, a standby (StartStandby, StartSyncStandby), to a
// primary with pg_promote, and returns once it has left recovery. From then
// on Start waits for it as for a primary. It fails if c is not running or
// not in recovery.
func (c *Cluster) Promote() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || c.proc.exited() {
		return fmt.Errorf("pgtest: Promote: PostgreSQL on port %d is not running", c.port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), syncTimeout)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		return fmt.Errorf("pgtest: Promote: connecting to port %d: %w", c.port, err)
	}
	defer conn.Close(context.Background())
	var promoted bool
	wait := int(syncTimeout / time.Second)
	if err := conn.QueryRow(ctx, fmt.Sprintf("SELECT pg_promote(true, %d)", wait), pgx.QueryExecModeSimpleProtocol).Scan(&promoted); err != nil {
		return withLog(fmt.Errorf("pgtest: Promote: pg_promote on port %d: %w", c.port, err), c.logPath)
	}
	if !promoted {
		return withLog(fmt.Errorf("pgtest: Promote: the standby on port %d was not promoted within %ds", c.port, wait), c.logPath)
	}
	var inRecovery bool
	if err := conn.QueryRow(ctx, "SELECT pg_is_in_recovery()", pgx.QueryExecModeSimpleProtocol).Scan(&inRecovery); err != nil {
		return fmt.Errorf("pgtest: Promote: port %d: %w", c.port, err)
	}
	if inRecovery {
		return errors.New("pgtest: Promote: pg_promote returned, and the server is still in recovery")
	}
	c.standby = false
	return nil
}

// FailoverURL returns a multi-host connection URL that names clusters in
// order, with target_session_attrs=read-write: pgx (like libpq) tries the
// hosts in turn and keeps the first that accepts writes, so that a client
// that reconnects after a failover reaches the promoted standby, and no
// client reaches a server in recovery.
func FailoverURL(clusters ...*Cluster) string {
	hosts := make([]string, len(clusters))
	for i, c := range clusters {
		hosts[i] = fmt.Sprintf("127.0.0.1:%d", c.port)
	}
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&target_session_attrs=read-write", superuser, strings.Join(hosts, ","))
}

// NewSyncStandby starts a synchronous standby of primary dedicated to the
// test (StartSyncStandby), closed when the test ends. If it cannot be
// started (pg_basebackup is missing, say) the test is skipped, or failed
// when $CI is set (see Unavailable).
func NewSyncStandby(t testing.TB, primary *Cluster) *Cluster {
	t.Helper()
	s, err := primary.StartSyncStandby()
	if err != nil {
		Unavailable(t, "no synchronous standby (it needs pg_basebackup: install postgresql-15, or point %s at a directory that has it): %v", envPGBinDir, err)
		return nil
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}
