package main

import (
	"context"
	"fmt"
)

// replication checks whether fencing tokens survive a failover. A token is
// safe once its draw has committed on a standby that a failover may
// promote, which synchronous replication gives; an asynchronous standby may
// lack the last draws, and once promoted it issues their tokens again
// (docs/fencing.md, "Replication"). Locks themselves need nothing of
// replication: a failover ends every session, and every lock with it.
//
// pg_stat_replication shows the sync_state of its walsenders only to
// superusers and members of pg_read_all_stats (pg_monitor); to other roles
// it shows a row per walsender and nulls.
func (d *doctor) replication(ctx context.Context) {
	const name = "replication"
	var names, commit string
	var senders, syncs, hidden int
	err := d.db.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('synchronous_standby_names'),
		pg_catalog.current_setting('synchronous_commit'),
		pg_catalog.count(*) FILTER (WHERE r.state IS DISTINCT FROM 'backup'),
		pg_catalog.count(*) FILTER (WHERE r.sync_state OPERATOR(pg_catalog.=) ANY (ARRAY['sync', 'quorum'])),
		pg_catalog.count(*) FILTER (WHERE r.sync_state IS NULL)
		FROM pg_catalog.pg_stat_replication r`).Scan(&names, &commit, &senders, &syncs, &hidden)
	if err != nil {
		d.fail(name, "check the server's logs", "reading synchronous_standby_names and pg_stat_replication: %v", err)
		return
	}
	const syncFix = "make a standby synchronous: ALTER SYSTEM SET synchronous_standby_names = 'ANY 1 (*)', then SELECT pg_reload_conf() (with Patroni: synchronous_mode: true)"
	switch {
	case names == "" && senders == 0:
		d.pass(name, "no standby streams from this server: a token is as durable as its commit here (draws commit with synchronous_commit on at least); a standby that a failover may promote must be synchronous")
	case names == "":
		d.fail(name, syncFix+"; a standby that is never promoted (a read replica, a logical subscriber) does not matter",
			"%s asynchronously (synchronous_standby_names is empty): once promoted, a standby may lack the last draws and issue their fencing tokens again", streams(senders))
	case hidden > 0:
		d.pass(name, "synchronous_standby_names is %q and %s, whose sync_state the role %q may not see: grant it pg_monitor to check that one is synchronous", names, streams(senders), d.info.user)
	case syncs == 0:
		d.fail(name, "start or reconnect a standby that synchronous_standby_names names, or empty the setting (then tokens do not survive a failover)",
			"synchronous_standby_names is %q, and no standby is synchronous: every commit that writes, the draws' included, waits until one is", names)
	default:
		d.pass(name, "%d of %s synchronously (synchronous_standby_names %q, synchronous_commit %s): a draw returns once one has its commit, so tokens survive a failover to it", syncs, streams(senders), names, commit)
	}
}

// streams says how many standbys stream from the server.
func streams(n int) string {
	if n == 1 {
		return "1 standby streams"
	}
	return fmt.Sprintf("%d standbys stream", n)
}
