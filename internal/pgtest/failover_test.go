package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// serverPort connects to url afresh and returns the port of the server it
// reached.
func serverPort(url string) (int, error) {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(c, url)
	if err != nil {
		return 0, err
	}
	defer conn.Close(context.Background())
	var port int
	err = conn.QueryRow(c, "SELECT inet_server_port()", pgx.QueryExecModeSimpleProtocol).Scan(&port)
	return port, err
}

// TestSyncStandbyFailover: the standby of StartSyncStandby is synchronous
// (a commit on the primary waits while it is down), and after the primary
// crashes, Promote makes it a primary that has every commit, accepts writes
// without waiting for a standby of its own, and restarts as a primary; a
// FailoverURL client reaches the primary before, nothing in between, and the
// promoted standby after.
func TestSyncStandbyFailover(t *testing.T) {
	t.Parallel()
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	standby := pgtest.NewSyncStandby(t, primary)
	url := pgtest.FailoverURL(primary, standby)

	p := openDB(t, primary.URL())
	rows := locktest.Rows(t, p, "SELECT state, sync_state FROM pg_stat_replication")
	require.Len(t, rows, 1)
	assert.Equal(t, map[string]string{"state": "streaming", "sync_state": "sync"}, rows[0])
	rows = locktest.Rows(t, p, "SELECT current_setting('synchronous_commit') AS c")
	assert.Equal(t, "on", rows[0]["c"])
	port, err := serverPort(url)
	require.NoError(t, err)
	assert.Equal(t, primary.Port(), port, "FailoverURL reaches the primary")

	_, err = p.ExecContext(ctx(t), "CREATE TABLE pgtest_failover (v text)")
	require.NoError(t, err)

	// Synchronous: with the standby down, a commit does not return.
	require.NoError(t, standby.Stop("fast"))
	c, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err = p.ExecContext(c, "INSERT INTO pgtest_failover VALUES ('waited')")
	cancel()
	require.Error(t, err, "a commit returned while the synchronous standby was down")
	t.Logf("a commit with the standby down: %v", err)
	require.NoError(t, standby.Start())
	start := time.Now()
	_, err = p.ExecContext(ctx(t), "INSERT INTO pgtest_failover VALUES ('replicated')")
	require.NoError(t, err)
	t.Logf("a commit after the standby restarted returned in %v", time.Since(start).Round(time.Millisecond))

	// The primary crashes: no server accepts writes.
	require.NoError(t, p.Close())
	require.NoError(t, primary.Stop("immediate"))
	_, err = serverPort(url)
	assert.Error(t, err, "FailoverURL reached a server while the only one left is in recovery")

	require.NoError(t, standby.Promote())
	port, err = serverPort(url)
	require.NoError(t, err)
	assert.Equal(t, standby.Port(), port, "FailoverURL reaches the promoted standby")
	s := openDB(t, standby.URL())
	var n int
	require.NoError(t, s.QueryRowContext(ctx(t), "SELECT count(*) FROM pgtest_failover WHERE v = 'replicated'").Scan(&n))
	assert.Equal(t, 1, n, "the promoted standby has the commit the primary acknowledged")
	c, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	_, err = s.ExecContext(c, "INSERT INTO pgtest_failover VALUES ('after')")
	cancel()
	require.NoError(t, err, "the promoted standby must commit without a standby of its own")
	assert.Error(t, standby.Promote(), "promoting a primary")

	// Promoted, it restarts as a primary.
	require.NoError(t, s.Close())
	require.NoError(t, standby.Stop("fast"))
	require.NoError(t, standby.Start())
	s = openDB(t, standby.URL())
	var inRecovery bool
	require.NoError(t, s.QueryRowContext(ctx(t), "SELECT pg_is_in_recovery()").Scan(&inRecovery))
	assert.False(t, inRecovery)
}
