package reliability_test

import (
	"context"
	"database/sql"
	"fmt"
	"math"
	"net/url"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/reliability/internal/checker"
)

// haTimeout is the ledger calls' WithTimeout in the HA tests.
const haTimeout = 10 * time.Second

// haHangBound is how much longer than haTimeout a call may take: a call
// that connects while no node is the primary tries each of the URL's three
// hosts, each for up to its connect_timeout (5 s).
const haHangBound = 15 * time.Second

// haFault is a fault TestHAPatroni injects into the primary. It returns
// the node it took out, to be restarted once the new primary serves, or -1.
type haFault struct {
	name string
	do   func(t *testing.T, p *pgtest.Patroni, primary int) (down int)
}

var haFaults = []haFault{
	{"failover", killPrimary},
	{"switchover", func(t *testing.T, p *pgtest.Patroni, primary int) int {
		require.NoError(t, p.Switchover(context.Background(), primary, syncStandby(t, p, primary)))
		return -1
	}},
	{"failover again", killPrimary},
	{"failover back", killPrimary},
}

// killPrimary crashes the primary's node: SIGKILL of its Patroni and its
// postmaster.
func killPrimary(t *testing.T, p *pgtest.Patroni, primary int) int {
	require.NoError(t, p.Kill(primary))
	return primary
}

// syncStandby returns the node that is the synchronous standby of primary
// (Patroni names each standby's application_name after its node).
func syncStandby(t *testing.T, p *pgtest.Patroni, primary int) int {
	t.Helper()
	db, err := sql.Open("pgx", p.NodeURL(primary))
	require.NoError(t, err)
	defer db.Close()
	var name string
	require.NoError(t, db.QueryRow(`SELECT application_name FROM pg_stat_replication WHERE sync_state = 'sync'`).Scan(&name),
		"the synchronous standby of %s", p.Name(primary))
	for i := range p.Nodes() {
		if p.Name(i) == name {
			return i
		}
	}
	t.Fatalf("no node is named %q", name)
	return -1
}

// serverPort is the port of the server that db's next connection reaches.
func serverPort(ctx context.Context, tx *sql.Tx) (int, error) {
	var port int
	err := tx.QueryRowContext(ctx, `SELECT inet_server_port()`).Scan(&port)
	return port, err
}

// firstGrant takes key on db until a lock is granted on a server other
// than the one on port old, and returns that server's port and when.
func firstGrant(db *sql.DB, key txlock.Key, old int, limit time.Duration) (port int, at time.Time, err error) {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		err = txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			port, err = serverPort(ctx, tx)
			return err
		}, txlock.WithTimeout(2*time.Second))
		if err == nil && port != old {
			return port, time.Now(), nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, time.Time{}, fmt.Errorf("no lock granted on a new primary within %v; the last call: port %d, %v", limit, port, err)
}

// logOnFailure logs the end of each node's Patroni log if t fails: its
// last 80 lines of PostgreSQL's and Patroni's own, without the tracebacks
// of REST clients that hung up and the lines that report no action.
func logOnFailure(t *testing.T, p *pgtest.Patroni) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i := range p.Nodes() {
			b, err := os.ReadFile(p.LogPath(i))
			if err != nil {
				t.Logf("%s: %v", p.Name(i), err)
				continue
			}
			var kept []string
			for _, line := range strings.Split(string(b), "\n") {
				switch {
				case line == "", strings.HasPrefix(line, " "), strings.Contains(line, "no action"),
					strings.Contains(line, "Traceback"), strings.Contains(line, "Exception happened"), strings.Contains(line, "Error: [Errno"):
					continue
				}
				kept = append(kept, line)
			}
			kept = kept[max(0, len(kept)-80):]
			t.Logf("the end of %s's log:\n%s", p.Name(i), strings.Join(kept, "\n"))
		}
	})
}

// faultTimes is one fault of TestHAPatroni: when it began, when a lock
// was first granted on the new primary, and how long that and the new term
// took.
type faultTimes struct {
	name          string
	at, granted   time.Time
	grant, termed time.Duration
}

// logFailureTimes logs, for each failure class, when its calls ended,
// counted from the fault before them, so that a failure the test does not
// expect can be placed.
func logFailureTimes(t *testing.T, run string, outcomes []checker.Outcome, faults []faultTimes) {
	type span struct {
		n          int
		first, end time.Duration
	}
	spans := map[string]*span{}
	var order []string
	for _, o := range outcomes {
		if o.Class == "ok" {
			continue
		}
		fault, since := "start", time.Duration(0)
		for _, f := range faults {
			if !o.End.Before(f.at) {
				fault, since = f.name, o.End.Sub(f.at)
			}
		}
		k := o.Class + " after the " + fault
		sp := spans[k]
		if sp == nil {
			sp = &span{first: since}
			spans[k] = sp
			order = append(order, k)
		}
		sp.n++
		sp.first, sp.end = min(sp.first, since), max(sp.end, since)
	}
	for _, k := range order {
		sp := spans[k]
		t.Logf("%s: %d %s, ending %v..%v after it", run, sp.n, k, sp.first.Round(time.Millisecond), sp.end.Round(time.Millisecond))
	}
}

// urlPort is the port of a single-host URL.
func urlPort(t *testing.T, raw string) int {
	t.Helper()
	u, err := url.Parse(raw)
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	return port
}

// TestHAPatroni runs the ledger workload (16 workers over 8 keys through a
// multi-host URL with target_session_attrs=read-write, and 8 more through
// HAProxy, each section drawing a fencing token) and a leader's campaign on
// a three-node Patroni cluster with synchronous_mode, while the primary fails over, is
// switched over, and fails over twice more. After each fault: no
// overlapping sections and no lost update; every token drawn once a lock is
// granted on the new primary is larger than every token drawn before the
// fault; the leader is elected again with a larger token. At the end: no
// acknowledged commit vanished, and no call took longer than its timeout
// plus haHangBound. The figures are the unavailability windows: from the
// fault to the first lock granted on the new primary, and to the new term.
func TestHAPatroni(t *testing.T) {
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{HAProxy: true})
	logOnFailure(t, p)
	ctx := context.Background()
	leaks := newLeaks()
	admin := pool(t, p.URL(), 4)
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, admin))
	db := pool(t, p.URL(), 40)           // 16 holders, and their draws
	proxied := pool(t, p.ProxyURL(), 20) // 8 holders through HAProxy, and their draws
	probe := pool(t, p.URL(), 2)
	leaderDB := pool(t, p.URL(), 4)
	l := newLedger(t, admin, checker.Config{Keys: keys, Tokens: true, Lock: checker.Locked(txlock.WithTimeout(haTimeout))})
	runs := []*checker.Run{l.Start(db, 16, 0), l.Start(proxied, 8, 0)}
	progress := func(what string) {
		t.Helper()
		for i, r := range runs {
			require.True(t, r.WaitFor(50, 2*time.Minute), "run %d: no progress %s", i, what)
		}
	}
	leaderKey := leaseKey(t)
	leader := campaign(t, "leader", client{db: leaderDB}, leaderKey, nil)
	term := leader.nextTerm(t, time.Minute, "before the faults")
	probeKey := txlock.StringKey("ha probe " + t.Name())

	var faults []faultTimes
	for _, f := range haFaults {
		progress("before the " + f.name)
		primary := p.Primary(ctx)
		require.GreaterOrEqual(t, primary, 0, "a primary before the %s", f.name)
		oldPort := urlPort(t, p.NodeURL(primary))

		at := time.Now()
		down := f.do(t, p, primary)
		port, granted, err := firstGrant(probe, probeKey, oldPort, 2*time.Minute)
		require.NoError(t, err, "after the %s", f.name)
		now := p.Primary(ctx)
		require.GreaterOrEqual(t, now, 0)
		assert.Equal(t, urlPort(t, p.NodeURL(now)), port, "the lock was granted on the primary Patroni names")
		next := leader.nextTerm(t, 2*time.Minute, "after the "+f.name)
		assert.Greater(t, next.token, term.token, "the new term's token")
		term = next
		ft := faultTimes{name: f.name, at: at, granted: granted, grant: granted.Sub(at), termed: next.won.Sub(at)}
		faults = append(faults, ft)
		t.Logf("%s: %s to %s; first lock on the new primary %v after the fault, the leader elected again %v after it, token %d",
			f.name, p.Name(primary), p.Name(now), ft.grant.Round(time.Millisecond), ft.termed.Round(time.Millisecond), next.token)
		check(t, l, "after the "+f.name)
		if down >= 0 {
			require.NoError(t, p.Restart(down))
		}
		require.NoError(t, p.WaitReplicas(2*time.Minute), "the cluster whole again after the %s", f.name)
	}
	progress("after the faults")
	var sums []checker.Summary
	var outcomes []checker.Outcome
	var acquired int64
	classes := map[string]int{}
	for i, r := range runs {
		s := r.Stop()
		t.Logf("%v", s)
		logFailureTimes(t, fmt.Sprintf("run %d", i), s.Outcomes, faults)
		requireOnly(t, s, append(connectionFaults, checker.ClassLockTimeout, checker.ClassStandby)...)
		sums = append(sums, s)
		outcomes = append(outcomes, s.Outcomes...)
		acquired += s.Acquisitions
		for c, n := range s.Classes {
			classes[c] += n
		}
	}
	leader.stop(t)
	rep := check(t, l, "after the run", sums...)

	// Tokens: every token drawn once the new primary granted a lock is
	// larger than every token drawn before the fault.
	var longest time.Duration
	for _, o := range outcomes {
		longest = max(longest, o.End.Sub(o.Start))
	}
	for _, ft := range faults {
		before, after := int64(0), int64(math.MaxInt64)
		for _, o := range outcomes {
			switch {
			case o.Token == 0:
			case o.Drawn.Before(ft.at):
				before = max(before, o.Token)
			case o.Drawn.After(ft.granted):
				after = min(after, o.Token)
			}
		}
		require.Positive(t, before, "tokens before the %s", ft.name)
		require.Less(t, after, int64(math.MaxInt64), "tokens after the %s", ft.name)
		assert.Greater(t, after, before, "a token drawn after the %s is not larger than every token drawn before it", ft.name)
	}
	assert.LessOrEqual(t, longest, haTimeout+haHangBound, "a call hung")
	finish(t, l, leaks, admin, db, proxied, probe, leaderDB)
	line := fmt.Sprintf("synchronous_mode=true workers=16+8(haproxy) keys=%d acquisitions=%d failures=%v overlaps=%d lost=%d vanished=%d ambiguous=%d longest_call=%v",
		keys, acquired, classes, rep.Overlaps, rep.LostUpdates(), rep.Vanished, rep.Ambiguous, longest.Round(time.Millisecond))
	for _, ft := range faults {
		line += fmt.Sprintf(" %q:lock=%v,term=%v", ft.name, ft.grant.Round(time.Millisecond), ft.termed.Round(time.Millisecond))
	}
	figures(t, "%s", line)
}

// TestHAPatroniPrimaryCutOff stops the primary's Patroni (SIGSTOP) while
// its PostgreSQL runs: the primary loses the leader key, and its
// synchronous standby is promoted. Clients still connected to the old
// primary (8 workers on its own URL) find it writable: they are granted
// locks there, as others are on the new primary (8 workers through
// HAProxy), but no COMMIT can complete there, since its synchronous standby
// has left it. With WithMaxHold the bound ends those commits with an
// outcome unknown (ErrCommitFailed), and none is reported as a success;
// without a bound a commit waits until the old primary is reset. A leader
// whose term is on the old primary keeps it (its heartbeats are SELECTs)
// while another is elected on the new primary with a larger token, until
// the reset ends the old term. Each section draws a fencing token: every
// token drawn on the old primary is smaller than every token drawn on the
// new one. After the reset: no overlapping sections, and no acknowledged
// commit lost.
func TestHAPatroniPrimaryCutOff(t *testing.T) {
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{HAProxy: true})
	ctx := context.Background()
	leaks := newLeaks()
	old := p.Primary(ctx)
	require.GreaterOrEqual(t, old, 0)
	logOnFailure(t, p)
	admin := pool(t, p.ProxyURL(), 4)
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, admin))
	const maxHold = 3 * time.Second
	lock := checker.Locked(txlock.WithTimeout(haTimeout), txlock.WithMaxHold(maxHold))
	l := newLedger(t, admin, checker.Config{Keys: keys, Tokens: true, Lock: lock})
	stuck := pool(t, p.NodeURL(old), 20) // clients of the old primary
	proxied := pool(t, p.ProxyURL(), 20) // clients that follow HAProxy
	stuckRun, proxiedRun := l.Start(stuck, 8, 0), l.Start(proxied, 8, 0)
	leaderKey := leaseKey(t)
	aDB, bDB := pool(t, p.NodeURL(old), 4), pool(t, p.ProxyURL(), 4)
	a := campaign(t, "A", client{db: aDB}, leaderKey, nil)
	first := a.nextTerm(t, time.Minute, "before the cut-off")
	b := campaign(t, "B", client{db: bDB}, leaderKey, nil)
	require.True(t, stuckRun.WaitFor(50, time.Minute))
	require.True(t, proxiedRun.WaitFor(50, time.Minute))

	at := time.Now()
	require.NoError(t, p.Freeze(old))
	now, err := p.WaitPrimary(ctx, old, 2*time.Minute)
	require.NoError(t, err)
	// Patroni names the new primary as it promotes it: from when it has
	// left recovery, it acknowledges no commit of the old primary's.
	newDB := pool(t, p.NodeURL(now), 1)
	require.Eventually(t, func() bool {
		var inRecovery bool
		return newDB.QueryRow(`SELECT pg_is_in_recovery()`).Scan(&inRecovery) == nil && !inRecovery
	}, time.Minute, 10*time.Millisecond, "%s leaves recovery", p.Name(now))
	promoted := time.Now()
	second := b.nextTerm(t, 2*time.Minute, "on the new primary")
	assert.NoError(t, first.term.Err(), "the leader on the old primary still holds its term")
	assert.Greater(t, second.token, first.token)
	require.True(t, proxiedRun.WaitFor(100, 2*time.Minute), "the clients through HAProxy go on, on the new primary")

	// A call with no bound on the old primary: its commit waits.
	unbounded := make(chan error, 1)
	go func() {
		unbounded <- txlock.WithLock(ctx, stuck, txlock.StringKey("cut-off "+t.Name()), func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `CREATE TABLE cutoff_probe (v int)`)
			return err
		})
	}()
	time.Sleep(3 * maxHold)
	select {
	case err := <-unbounded:
		t.Fatalf("a commit on the cut-off primary returned: %v", err)
	default:
	}
	var held int
	require.NoError(t, stuck.QueryRow(`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted`).Scan(&held))
	t.Logf("cut off %v after the stop, %s promoted; %d advisory locks held on the old primary meanwhile", promoted.Sub(at).Round(time.Millisecond), p.Name(now), held)
	{
		diag := pool(t, p.NodeURL(old), 1)
		var ssn, sc string
		require.NoError(t, diag.QueryRow(`SELECT current_setting('synchronous_standby_names'), current_setting('synchronous_commit')`).Scan(&ssn, &sc))
		rows, err := diag.Query(`SELECT application_name, state, coalesce(sync_state, ''), coalesce(flush_lsn::text, '') FROM pg_stat_replication`)
		require.NoError(t, err)
		var reps []string
		for rows.Next() {
			var a, st, ss, fl string
			require.NoError(t, rows.Scan(&a, &st, &ss, &fl))
			reps = append(reps, a+" "+st+" "+ss+" "+fl)
		}
		var lsn string
		require.NoError(t, diag.QueryRow(`SELECT pg_current_wal_lsn()::text`).Scan(&lsn))
		t.Logf("old primary before the reset: synchronous_standby_names %q, synchronous_commit %s, WAL at %s, senders %q", ssn, sc, lsn, reps)
		diag.Close()
	}

	// The old primary is reset, as Patroni's watchdog would reset its
	// machine: SIGKILL of its frozen Patroni, its postmaster and every
	// child, and a restart, from which it rejoins as a replica. Resumed
	// instead (TXLOCK_HA_THAW), Patroni 3.0.2 can take the leader key back
	// from the promoted node (docs/ha.md).
	thawed := time.Now()
	if os.Getenv("TXLOCK_HA_THAW") != "" {
		require.NoError(t, p.Thaw(old))
	} else {
		require.NoError(t, p.Kill(old))
		require.NoError(t, p.Restart(old))
	}
	select {
	case err := <-unbounded:
		t.Logf("the unbounded call returned %v after the reset: %v", time.Since(thawed).Round(time.Millisecond), err)
		assert.Error(t, err)
	case <-time.After(2 * time.Minute):
		t.Fatal("the unbounded call did not return within 2m of the reset")
	}
	lost := lostWithin(t, first, thawed, 2*time.Minute, "the reset")
	both := first.lost.Sub(second.won)
	a.stop(t)
	b.stop(t)
	require.NoError(t, p.WaitReplicas(2*time.Minute))

	stuckSum, proxiedSum := stuckRun.Stop(), proxiedRun.Stop()
	t.Logf("old primary's clients: %v", stuckSum)
	t.Logf("HAProxy's clients: %v", proxiedSum)
	rep := check(t, l, "after the cut-off", stuckSum, proxiedSum)
	// Once the standby was promoted, no call on the old primary succeeded
	// (a call that returned within a second of it may have committed just
	// before), and the hold bound ended the calls that waited there for the
	// gone standby: at COMMIT (an ambiguous commit), or in fn, whose token
	// draw waits for the standby too (a hold timeout). Which of the two
	// ends a call depends on where the promotion finds it.
	var okAfter, ambiguous, heldTooLong int
	var longest time.Duration
	for _, o := range stuckSum.Outcomes {
		longest = max(longest, o.End.Sub(o.Start))
		if o.End.After(promoted.Add(time.Second)) && o.End.Before(thawed) {
			switch {
			case o.Class == "ok":
				okAfter++
			case o.Commit:
				ambiguous++
			case o.Class == checker.ClassHoldTimeout:
				heldTooLong++
			}
		}
	}
	// Tokens: a draw commits durably, so none returns on the cut-off
	// primary once its standby has left it; every token the old primary's
	// clients drew is smaller than every token drawn on the new primary.
	oldMax, newMin := int64(0), int64(math.MaxInt64)
	for _, o := range stuckSum.Outcomes {
		oldMax = max(oldMax, o.Token)
	}
	for _, o := range proxiedSum.Outcomes {
		longest = max(longest, o.End.Sub(o.Start))
		if o.Token != 0 && o.Drawn.After(promoted) {
			newMin = min(newMin, o.Token)
		}
	}
	require.Positive(t, oldMax, "tokens on the old primary")
	require.Less(t, newMin, int64(math.MaxInt64), "tokens on the new primary")
	if !assert.Less(t, oldMax, newMin, "a token drawn on the old primary is not smaller than every token drawn on the new one") {
		for _, o := range stuckSum.Outcomes {
			if o.Token >= newMin {
				t.Logf("old primary: token %d drawn %v after the stop (promoted at %v), call ended %v after it: %s, commit %v",
					o.Token, o.Drawn.Sub(at), promoted.Sub(at), o.End.Sub(at), o.Class, o.Commit)
			}
		}
		for _, o := range proxiedSum.Outcomes {
			if o.Token != 0 && o.Token <= oldMax && o.Drawn.After(promoted) {
				t.Logf("new primary: token %d drawn %v after the stop, call ended %v after it: %s", o.Token, o.Drawn.Sub(at), o.End.Sub(at), o.Class)
			}
		}
	}
	assert.Zero(t, okAfter, "a call on the cut-off primary reported success")
	assert.Positive(t, ambiguous+heldTooLong, "the hold bound must end the calls that wait on the cut-off primary")
	assert.LessOrEqual(t, longest, haTimeout+maxHold+haHangBound, "a bounded call hung")
	finish(t, l, leaks, admin, proxied, stuck, aDB, bDB, newDB)
	figures(t, "promoted_after=%v old_primary_calls_while_cut_off: ok=%d ambiguous=%d hold_timeouts=%d failures=%v; two_leaders_for=%v (old term lost %v after the reset); term tokens old=%d new=%d; section tokens old<=%d new>=%d; overlaps=%d lost=%d vanished=%d longest_call=%v",
		promoted.Sub(at).Round(time.Millisecond), okAfter, ambiguous, heldTooLong, stuckSum.Classes, both.Round(time.Millisecond), lost.Round(time.Millisecond),
		first.token, second.token, oldMax, newMin, rep.Overlaps, rep.LostUpdates(), rep.Vanished, longest.Round(time.Millisecond))
}

// drawTokens takes key on db n times, drawing a fencing token each time,
// and returns the tokens.
func drawTokens(t *testing.T, db *sql.DB, key txlock.Key, n int) []int64 {
	t.Helper()
	var tokens []int64
	for range n {
		require.NoError(t, txlock.WithLock(context.Background(), db, key, func(ctx context.Context, tx *sql.Tx) error {
			token, err := txlock.FenceToken(ctx)
			tokens = append(tokens, token)
			return err
		}, txlock.WithTimeout(haTimeout)))
	}
	return tokens
}

// TestHAPatroniAsyncTokens shows that with asynchronous replication a
// failover can hand out fencing tokens again, and that advancing the
// sequence after it restores their order. The primary's WAL senders are
// stopped (SIGSTOP) while 100 tokens are drawn on the primary, whose
// commits do not wait for them; the primary then crashes, and Patroni
// promotes a standby, whose lag is within maximum_lag_on_failover (1 MB).
// The new primary's sequence is behind the tokens already handed out.
// Advanced by twice the draws that maximum_lag_on_failover's worth of WAL
// can hold (measured: WAL bytes per draw), its tokens are larger than
// every token before the failover again.
func TestHAPatroniAsyncTokens(t *testing.T) {
	p := pgtest.NewPatroni(t, pgtest.PatroniOptions{Async: true})
	logOnFailure(t, p)
	ctx := context.Background()
	old := p.Primary(ctx)
	require.GreaterOrEqual(t, old, 0)
	db := pool(t, p.URL(), 4)
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, db))
	key := txlock.StringKey("async tokens " + t.Name())
	drawTokens(t, db, key, 5)

	// Stop the primary's WAL senders, not the standbys' receivers: a
	// stopped receiver's socket still takes in what the sender writes, and
	// replays it once resumed.
	var stopped []int
	rows, err := db.Query(`SELECT pid FROM pg_stat_replication`)
	require.NoError(t, err)
	for rows.Next() {
		var pid int
		require.NoError(t, rows.Scan(&pid))
		require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
		stopped = append(stopped, pid)
	}
	require.NoError(t, rows.Err())
	require.Len(t, stopped, p.Nodes()-1, "a WAL sender for each standby")
	t.Cleanup(func() {
		for _, pid := range stopped {
			syscall.Kill(pid, syscall.SIGCONT)
		}
	})
	var lsn0, lsn1 string
	require.NoError(t, db.QueryRow(`SELECT pg_current_wal_lsn()::text`).Scan(&lsn0))
	before := drawTokens(t, db, key, 100)
	var walBytes int64
	require.NoError(t, db.QueryRow(`SELECT pg_current_wal_lsn()::text, pg_current_wal_lsn() - $1::pg_lsn`, lsn0).Scan(&lsn1, &walBytes))
	last := before[len(before)-1]
	require.NoError(t, db.Close())
	for i := range p.Nodes() {
		if i == old {
			continue
		}
		r := pool(t, p.NodeURL(i), 1)
		var behind bool
		require.NoError(t, r.QueryRow(`SELECT pg_last_wal_receive_lsn() <= $1::pg_lsn`, lsn0).Scan(&behind))
		require.NoError(t, r.Close())
		require.True(t, behind, "%s received none of the draws' WAL (after %s)", p.Name(i), lsn0)
	}

	// The crash kills the stopped senders with the rest of the primary.
	at := time.Now()
	require.NoError(t, p.Kill(old))
	now, err := p.WaitPrimary(ctx, old, 2*time.Minute)
	require.NoError(t, err)
	db = pool(t, p.URL(), 4)
	var again []int64
	require.Eventually(t, func() bool {
		err := txlock.WithLock(ctx, db, key, func(ctx context.Context, tx *sql.Tx) error {
			token, err := txlock.FenceToken(ctx)
			if err == nil {
				again = append(again, token)
			}
			return err
		}, txlock.WithTimeout(time.Second))
		return err == nil
	}, 2*time.Minute, 50*time.Millisecond, "a token on the new primary")
	t.Logf("%s promoted %v after the crash; tokens %d..%d were handed out before it (%d bytes of WAL, %.0f per draw); the new primary hands out %d",
		p.Name(now), time.Since(at).Round(time.Millisecond), before[0], last, walBytes, float64(walBytes)/100, again[0])
	assert.LessOrEqual(t, again[0], last, "the promoted standby's sequence is behind the tokens handed out (or the WAL receivers were not stopped)")

	// The remedy: advance the sequence by more than the draws that
	// maximum_lag_on_failover (1 MB) of WAL can hold, twice over.
	margin := 2 * (1 << 20) / max(walBytes/100, 1)
	_, err = db.Exec(`SELECT setval('public.txlock_fence_seq', nextval('public.txlock_fence_seq') + $1)`, margin)
	require.NoError(t, err)
	after := drawTokens(t, db, key, 5)
	assert.Greater(t, after[0], last, "advanced by %d, tokens come after every token before the failover", margin)
	require.NoError(t, p.Restart(old))
	require.NoError(t, p.WaitReplicas(2*time.Minute))
	figures(t, "synchronous_mode=false tokens_before=%d..%d first_token_after_failover=%d wal_bytes_per_draw=%.0f setval_margin=%d token_after_setval=%d",
		before[0], last, again[0], float64(walBytes)/100, margin, after[0])
}
