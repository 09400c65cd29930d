package main

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

// newStandby starts an asynchronous hot standby of c, closed when the test
// ends.
func newStandby(t *testing.T, c *pgtest.Cluster) *pgtest.Cluster {
	t.Helper()
	s, err := c.StartStandby()
	if err != nil {
		pgtest.Unavailable(t, "no hot standby (it needs pg_basebackup): %v", err)
		return nil
	}
	t.Cleanup(func() { assert.NoError(t, s.Close()) })
	return s
}

// waitSenders waits until c's pg_stat_replication has n walsenders that
// stream.
func waitSenders(t *testing.T, c *pgtest.Cluster, n int) {
	t.Helper()
	db := openPool(t, c.URL())
	require.Eventually(t, func() bool {
		var got int
		err := db.QueryRow(`SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&got)
		return err == nil && got == n
	}, time.Minute, 20*time.Millisecond, "%d walsenders streaming", n)
}

// replicationLine returns doctor's line for the replication check, and its
// fix, if any.
func replicationLine(t *testing.T, url string) (mark, out string) {
	t.Helper()
	r := cli(t, "doctor", "--db", url)
	t.Log("\n" + r.stdout)
	return marks(t, r.stdout)["replication"], r.stdout
}

// TestDoctorReplication walks one primary through the states a failover
// cares about: no standby, an asynchronous one, a synchronous one (seen by
// a superuser and by a role that may not see sync_state), and a
// synchronous_standby_names that no standby meets.
func TestDoctorReplication(t *testing.T) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	db := openPool(t, c.URL())
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), db))

	mark, out := replicationLine(t, c.URL())
	assert.Equal(t, "✓", mark)
	assert.Regexp(t, `(?m)^✓ replication +no standby streams from this server: `, out)

	async := newStandby(t, c)
	waitSenders(t, c, 1)
	mark, out = replicationLine(t, c.URL())
	assert.Equal(t, "✗", mark)
	assert.Regexp(t, `(?m)^✗ replication +1 standby streams asynchronously \(synchronous_standby_names is empty\): once promoted, a standby may lack the last draws and issue their fencing tokens again$`, out)
	assert.Regexp(t, `(?m)^ +fix: make a standby synchronous: ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 \(\*\)'`, out)
	assert.Contains(t, out, "1 of 9 checks failed")

	sync := pgtest.NewSyncStandby(t, c) // synchronous_standby_names '*': the first to connect is sync, the other potential
	waitSenders(t, c, 2)
	mark, out = replicationLine(t, c.URL())
	assert.Equal(t, "✓", mark)
	assert.Regexp(t, `(?m)^✓ replication +1 of 2 standbys stream synchronously \(synchronous_standby_names "\*", synchronous_commit on\): a draw returns once one has its commit`, out)

	// A role without pg_monitor sees a row per walsender and nulls.
	role := randomName("doctor_")
	_, err := db.Exec(`CREATE ROLE ` + role + ` LOGIN`)
	require.NoError(t, err)
	mark, out = replicationLine(t, withUser(t, c.URL(), role))
	assert.Equal(t, "✓", mark)
	assert.Regexp(t, `(?m)^✓ replication +synchronous_standby_names is "\*" and 2 standbys stream, whose sync_state the role "`+role+`" may not see: grant it pg_monitor`, out)
	_, err = db.Exec(`GRANT pg_monitor TO ` + role)
	require.NoError(t, err)
	mark, out = replicationLine(t, withUser(t, c.URL(), role))
	assert.Equal(t, "✓", mark)
	assert.Regexp(t, `(?m)^✓ replication +1 of 2 standbys stream synchronously`, out)

	// Both standbys gone, with synchronous_standby_names still set.
	require.NoError(t, async.Close())
	require.NoError(t, sync.Close())
	waitSenders(t, c, 0)
	mark, out = replicationLine(t, c.URL())
	assert.Equal(t, "✗", mark)
	assert.Regexp(t, `(?m)^✗ replication +synchronous_standby_names is "\*", and no standby is synchronous: every commit that writes, the draws' included, waits until one is$`, out)
	assert.Regexp(t, `(?m)^ +fix: start or reconnect a standby that synchronous_standby_names names`, out)

	// Without fencing tokens, replication is not checked.
	r := cli(t, "doctor", "--db", c.URL(), "--fence-seq=")
	assert.Equal(t, 0, r.code, "%+v", r)
	assert.NotContains(t, r.stdout, "replication")
}

// withUser returns raw with its user replaced.
func withUser(t *testing.T, raw, user string) string {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	u.User = url.User(user)
	return u.String()
}

// TestDoctorPatroni runs doctor on a three-node Patroni cluster, through
// its multi-host URL: with synchronous_mode, Patroni names one standby in
// synchronous_standby_names, and the check passes; without it, both
// standbys stream asynchronously, and the check fails with its fix.
func TestDoctorPatroni(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "synchronous_mode", true: "asynchronous"}[async], func(t *testing.T) {
			p := pgtest.NewPatroni(t, pgtest.PatroniOptions{Async: async})
			db := openPool(t, p.URL())
			require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), db))
			require.Eventually(t, func() bool {
				var n int
				return db.QueryRow(`SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&n) == nil && n == p.Nodes()-1
			}, time.Minute, 50*time.Millisecond, "both standbys stream")
			mark, out := replicationLine(t, p.URL())
			if async {
				assert.Equal(t, "✗", mark)
				assert.Regexp(t, `(?m)^✗ replication +2 standbys stream asynchronously \(synchronous_standby_names is empty\)`, out)
				assert.Regexp(t, `(?m)^ +fix: make a standby synchronous: .*\(with Patroni: synchronous_mode: true\)`, out)
				return
			}
			assert.Equal(t, "✓", mark)
			assert.Regexp(t, `(?m)^✓ replication +1 of 2 standbys stream synchronously \(synchronous_standby_names "node\d", synchronous_commit on\)`, out)
		})
	}
}
