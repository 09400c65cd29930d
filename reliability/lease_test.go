package reliability_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
	"github.com/txlock/txlock/reliability/internal/checker"
)

// Terms (leases and leader election: AcquireTerm, Lead) under faults: a
// partition between the leader and PostgreSQL, a PgBouncer killed and
// restarted, and a failover to a synchronous standby. Candidates campaign
// as Lead's documentation shows, in a loop; each test measures how long the
// leader takes to learn it lost its term, and how long the next term takes
// to begin.

// leaseBeat is the heartbeat of the leaders here: a short interval, so that
// a fault is detected quickly; a Timeout of two seconds, twice a loaded
// machine's pause (a server that stalls for a second stalls the heartbeat
// sent as it began for that long, and a heartbeat that times out ends the
// term), so that a healthy term does not end spuriously; and a TTL far
// enough above the detection bound plus leaseSlack (4.25s, below the local
// expiry at 4.95s) that an assertion on detection tells a failed heartbeat
// apart from the local expiry.
var leaseBeat = txlock.Heartbeat{Interval: 250 * time.Millisecond, Timeout: 2 * time.Second, TTL: 5 * time.Second}

// leaseDetect is how long a leader may take to learn that its term is lost
// once the fault begins: the next heartbeat starts within Interval, and
// fails or times out within Timeout.
var leaseDetect = leaseBeat.Interval + leaseBeat.Timeout

// leaseSlack is added to every bound: a shared, loaded 2-core machine
// pauses a process, or the server, for about a second at times.
const leaseSlack = 2 * time.Second

// leasePoll is the campaign's polling, tighter than the default, so that the
// time until a free lock is won measures the server, not the backoff.
var leasePoll = txlock.WithRetry(txlock.ExponentialBackoff{Min: 10 * time.Millisecond, Max: 50 * time.Millisecond})

// campaignPause is how long a candidate waits after a campaign that ended
// in an error (the server, or PgBouncer, is down) before the next one.
const campaignPause = 100 * time.Millisecond

// wonTerm is one term a candidate won.
type wonTerm struct {
	term  *txlock.Term
	token int64
	won   time.Time // fn began

	// Set once fn's context has ended, before ended is closed.
	lost  time.Time
	cause error // context.Cause of fn's context
	ended chan struct{}
}

// candidate campaigns for key on db in a loop, one Lead call per term, until
// stopped.
type candidate struct {
	name   string
	won    chan *wonTerm // each term, when fn begins
	cancel context.CancelFunc
	done   chan struct{}

	mu        sync.Mutex
	campaigns int   // Lead calls that ended in an error other than a loss
	lastErr   error // the last of them
	onWin     func(w *wonTerm)
}

// campaign starts a candidate on cl: txlock's Lead on a *sql.DB, or
// pgxlock's on a *pgxpool.Pool. onWin, if not nil, runs first thing in each
// term's fn. The candidate is stopped when the test ends, if not before.
func campaign(t *testing.T, name string, cl client, key txlock.Key, onWin func(w *wonTerm), opts ...txlock.TermOption) *candidate {
	ctx, cancel := context.WithCancel(context.Background())
	c := &candidate{name: name, won: make(chan *wonTerm, 16), cancel: cancel, done: make(chan struct{}), onWin: onWin}
	opts = append([]txlock.TermOption{txlock.WithHeartbeat(leaseBeat), leasePoll}, opts...)
	go func() {
		defer close(c.done)
		for ctx.Err() == nil {
			err := cl.lead(ctx, key, func(ctx context.Context, term *txlock.Term) error {
				w := &wonTerm{term: term, token: term.Token(), won: time.Now(), ended: make(chan struct{})}
				if c.onWin != nil {
					c.onWin(w)
				}
				c.won <- w
				<-ctx.Done()
				w.lost, w.cause = time.Now(), context.Cause(ctx)
				close(w.ended)
				return nil
			}, opts...)
			switch {
			case err == nil, errors.Is(err, txlock.ErrLockLost):
			case ctx.Err() == nil:
				c.mu.Lock()
				c.campaigns++
				c.lastErr = err
				c.mu.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(campaignPause):
				}
			}
		}
	}()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// lead is Lead on cl's pool, txlock's or pgxlock's.
func (c client) lead(ctx context.Context, key txlock.Key, fn func(context.Context, *txlock.Term) error, opts ...txlock.TermOption) error {
	if c.pgx != nil {
		return pgxlock.Lead(ctx, c.pgx, key, fn, opts...)
	}
	return txlock.Lead(ctx, c.db, key, fn, opts...)
}

// acquireTerm is AcquireTerm on cl's pool, txlock's or pgxlock's.
func (c client) acquireTerm(ctx context.Context, key txlock.Key, opts ...txlock.TermOption) (*txlock.Term, error) {
	if c.pgx != nil {
		return pgxlock.AcquireTerm(ctx, c.pgx, key, opts...)
	}
	return txlock.AcquireTerm(ctx, c.db, key, opts...)
}

// leaseLibs are the libraries whose terms the fault tests run: txlock's
// on a *sql.DB, then pgxlock's on a *pgxpool.Pool.
var leaseLibs = []string{"txlock", "pgxlock"}

// failed returns how many campaigns ended in an error, and the last one.
func (c *candidate) failed() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.campaigns, c.lastErr
}

// stop ends the candidate's campaign, and its term if it holds one, and
// waits for it to return.
func (c *candidate) stop(t *testing.T) {
	t.Helper()
	c.cancel()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		t.Errorf("candidate %s did not stop within 30s of its context's end", c.name)
	}
}

// nextTerm waits up to timeout for c's next term.
func (c *candidate) nextTerm(t *testing.T, timeout time.Duration, what string) *wonTerm {
	t.Helper()
	select {
	case w := <-c.won:
		return w
	case <-time.After(timeout):
		n, err := c.failed()
		t.Fatalf("%s: candidate %s won no term within %v (%d campaigns failed, the last with: %v)", what, c.name, timeout, n, err)
		return nil
	}
}

// noTerm asserts that c wins no term for d.
func (c *candidate) noTerm(t *testing.T, d time.Duration, what string) {
	t.Helper()
	select {
	case w := <-c.won:
		t.Fatalf("%s: candidate %s won a term (token %d)", what, c.name, w.token)
	case <-time.After(d):
	}
}

// lostWithin waits up to timeout for w to end, and returns how long after
// since it did, failing t unless it ended as lost (ErrLockLost).
func lostWithin(t *testing.T, w *wonTerm, since time.Time, timeout time.Duration, what string) time.Duration {
	t.Helper()
	select {
	case <-w.ended:
	case <-time.After(timeout):
		t.Fatalf("%s: the leader's context was not cancelled within %v (term token %d, Err %v)", what, timeout, w.token, w.term.Err())
	}
	after := w.lost.Sub(since)
	t.Logf("%s: the leader's context was cancelled %v after the fault: %v", what, after.Round(time.Millisecond), w.cause)
	require.ErrorIs(t, w.cause, txlock.ErrLockLost, "%s: the cause of the leader's context", what)
	require.ErrorIs(t, w.term.Err(), txlock.ErrLockLost, "%s: the term's Err", what)
	return after
}

// events records the events of one candidate.
type events struct {
	mu  sync.Mutex
	got []txlock.Event
}

func (ev *events) observer() txlock.Option {
	return txlock.WithObserver(txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		ev.mu.Lock()
		ev.got = append(ev.got, e)
		ev.mu.Unlock()
		return ctx
	}))
}

// lost returns the TermLost events.
func (ev *events) lost() []txlock.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []txlock.Event
	for _, e := range ev.got {
		if e.Kind == txlock.TermLost {
			out = append(out, e)
		}
	}
	return out
}

// requireTermLost asserts that exactly one TermLost event was reported, for
// the term w.
func requireTermLost(t *testing.T, ev *events, w *wonTerm) {
	t.Helper()
	require.Eventually(t, func() bool { return len(ev.lost()) > 0 }, 10*time.Second, 10*time.Millisecond, "no TermLost event")
	lost := ev.lost()
	require.Len(t, lost, 1, "TermLost events")
	assert.ErrorIs(t, lost[0].Err, txlock.ErrLockLost)
	assert.Equal(t, w.token, lost[0].Token, "the TermLost event's token")
}

// heldOn returns how many backends of db's server hold key.
func heldOn(t *testing.T, db *sql.DB, key txlock.Key) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pids, err := checker.HeldBy(ctx, db, key)
	require.NoError(t, err)
	return len(pids)
}

// anyPhase returns a random part of a heartbeat interval. A test waits for
// it before it injects a fault, so that the fault does not always land just
// as a heartbeat is sent, which would hide the wait for the next one.
func anyPhase() time.Duration { return rand.N(leaseBeat.Interval) }

// leaseKey is a key of the test's own.
func leaseKey(t *testing.T) txlock.Key {
	return txlock.StringKey(fmt.Sprintf("%s/%d", t.Name(), time.Now().UnixNano()))
}

// TestLeaseBlackhole partitions the leader from PostgreSQL, and from
// PgBouncer: a toxiproxy between them drops every byte in both directions
// and passes no close on (the blackhole toxic), as a network partition
// does; toxiproxy's timeout toxic, a disabled proxy or limit_data would
// close the connection instead, which the other side sees at once. Neither
// a reset nor a FIN reaches either side: the leader learns of the fault only
// because a heartbeat times out, and the server only because its
// idle_in_transaction_session_timeout (the TTL) passes. The leader's
// context must be cancelled within Interval+Timeout, and a candidate
// connected directly to PostgreSQL must win within the TTL, and only once
// the leader's term is over.
//
// The leader's terms are txlock's, then pgxlock's; the direct candidate's
// are txlock's.
func TestLeaseBlackhole(t *testing.T) {
	for _, lib := range leaseLibs {
		for _, target := range networkTargets {
			t.Run(variant{lib, target.name}.name(), func(t *testing.T) { testLeaseBlackhole(t, lib, target) })
		}
	}
}

func testLeaseBlackhole(t *testing.T, lib string, target networkTarget) {
	admin, px, dsn, leaks := setup(t, target)
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, admin))
	leaderCl := newClient(t, lib, dsn, 4) // through the proxy, to the target
	directDB := pool(t, pgtest.Postgres(t), 4)
	key := leaseKey(t)

	var ev events
	leader := campaign(t, "leader", leaderCl, key, nil, ev.observer())
	first := leader.nextTerm(t, 30*time.Second, "before the fault")
	require.Equal(t, 1, heldOn(t, admin, key))

	// At the new term's start, the old one must be known to be over.
	var oldErr error
	other := campaign(t, "direct", client{db: directDB}, key, func(w *wonTerm) { oldErr = first.term.Err() })
	other.noTerm(t, 4*leaseBeat.Interval+anyPhase(), "while the leader's heartbeats succeed")
	require.NoError(t, first.term.Err())

	px.add("blackhole", `{}`)
	start := time.Now()
	detected := lostWithin(t, first, start, leaseBeat.TTL+30*time.Second, "blackhole")
	assert.LessOrEqual(t, detected, leaseDetect+leaseSlack, "the leader must learn of the partition within Interval+Timeout (%v) plus slack", leaseDetect)
	requireTermLost(t, &ev, first)
	// The partitioned leader campaigns again, through the partition: stop
	// it, so that it does not win once the partition heals.
	leader.stop(t)

	next := other.nextTerm(t, leaseBeat.TTL+30*time.Second, "blackhole")
	won := next.won.Sub(start)
	t.Logf("blackhole: the direct candidate won %v after the fault (TTL %v), with token %d (the leader's was %d)",
		won.Round(time.Millisecond), leaseBeat.TTL, next.token, first.token)
	assert.LessOrEqual(t, won, leaseBeat.TTL+leaseSlack, "the server must release the partitioned leader's lock within the TTL plus slack")
	assert.ErrorIs(t, oldErr, txlock.ErrLockLost, "when the next term began, the partitioned leader's term was not over")
	assert.Greater(t, won, detected, "the next term began before the partitioned leader learned it lost its own")
	assert.Greater(t, next.token, first.token)
	assert.Equal(t, 1, heldOn(t, admin, key))

	// Heal the partition (which closes the blackholed connections, and with
	// them pgx's cancel request of the timed-out heartbeat), then end.
	px.clear()
	other.stop(t)
	px.stop()
	leaderCl.finish(t, nil, leaks, admin, directDB)
	figures(t, "lib=%s target=%s interval=%v timeout=%v ttl=%v leader_cancelled_after=%v next_term_after=%v",
		lib, target.name, leaseBeat.Interval, leaseBeat.Timeout, leaseBeat.TTL, detected.Round(time.Millisecond), won.Round(time.Millisecond))
}

// TestLeasePgBouncerKill kills PgBouncer (SIGKILL) under a leader connected
// through it: the leader's context is cancelled within Interval+Timeout,
// and the server, whose connections from PgBouncer close, releases the
// lock. PgBouncer is started again on the same port, and the same
// candidate, campaigning in its loop, wins a new term with a larger token.
// It runs with txlock's terms, then with pgxlock's.
func TestLeasePgBouncerKill(t *testing.T) {
	for _, lib := range leaseLibs {
		t.Run(lib, func(t *testing.T) { testLeasePgBouncerKill(t, lib) })
	}
}

func testLeasePgBouncerKill(t *testing.T, lib string) {
	c := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	b := pgtest.NewBouncer(t, c, pgtest.BouncerOptions{PoolSize: 4})
	leaks := newLeaks()
	admin := pool(t, c.URL(), 4)
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, admin))
	db := newClient(t, lib, bouncerDSN(b.URL()), 4)
	key := leaseKey(t)

	var ev events
	leader := campaign(t, "leader", db, key, nil, ev.observer())
	first := leader.nextTerm(t, 30*time.Second, "before the kill")
	time.Sleep(4*leaseBeat.Interval + anyPhase())
	require.NoError(t, first.term.Err(), "the term must hold through PgBouncer")
	require.Equal(t, 1, heldOn(t, admin, key))

	start := time.Now()
	require.NoError(t, b.Kill())
	detected := lostWithin(t, first, start, leaseBeat.TTL+30*time.Second, "PgBouncer killed")
	assert.LessOrEqual(t, detected, leaseDetect+leaseSlack, "the leader must learn of the kill within Interval+Timeout (%v) plus slack", leaseDetect)
	requireTermLost(t, &ev, first)
	require.NoError(t, checker.NoAdvisoryLocks(admin, 10*time.Second), "the server must release the killed pooler's lock")
	released := time.Since(start)
	leader.noTerm(t, 4*leaseBeat.Interval, "while PgBouncer is down")

	restart := time.Now()
	require.NoError(t, b.Start())
	started := time.Since(restart)
	second := leader.nextTerm(t, 60*time.Second, "after PgBouncer restarted")
	rewon := second.won.Sub(restart)
	failures, lastErr := leader.failed()
	t.Logf("PgBouncer killed: lock released by the server within %v; restarted in %v; the leader won again %v after the restart, with token %d (was %d); %d campaigns failed meanwhile, the last with: %v",
		released.Round(time.Millisecond), started.Round(time.Millisecond), rewon.Round(time.Millisecond), second.token, first.token, failures, lastErr)
	assert.Positive(t, failures, "campaigns while PgBouncer was down must fail")
	assert.Contains(t, connectionFaults, checker.Classify(lastErr), "a campaign with PgBouncer down: %v", lastErr)
	assert.Greater(t, second.token, first.token)
	assert.Equal(t, 1, heldOn(t, admin, key))
	time.Sleep(4 * leaseBeat.Interval)
	assert.NoError(t, second.term.Err(), "the new term must hold through the restarted PgBouncer")

	leader.stop(t)
	db.finish(t, nil, leaks, admin)
	figures(t, "lib=%s interval=%v timeout=%v leader_cancelled_after=%v lock_released_within=%v rewon_after_restart=%v",
		lib, leaseBeat.Interval, leaseBeat.Timeout, detected.Round(time.Millisecond), released.Round(time.Millisecond), rewon.Round(time.Millisecond))
}

// leaseTokens runs n terms of key on db, one after another, and returns
// their tokens.
func leaseTokens(t *testing.T, db *sql.DB, key txlock.Key, n int) []int64 {
	t.Helper()
	ctx := context.Background()
	var tokens []int64
	for range n {
		term, err := txlock.AcquireTerm(ctx, db, key, txlock.WithHeartbeat(leaseBeat), leasePoll, txlock.WithTimeout(30*time.Second))
		require.NoError(t, err)
		tokens = append(tokens, term.Token())
		require.NoError(t, term.Release(ctx))
	}
	return tokens
}

// TestLeaseFailover fails over from a primary to its synchronous standby
// under a leader, with every candidate on a multi-host URL
// (target_session_attrs=read-write): 1. the primary is stopped (immediate
// shutdown: a crash); 2. the standby is promoted; 3. the leader's context
// is cancelled within Interval+Timeout of the stop; 4. a candidate wins a
// term on the new primary. With synchronous replication (and
// synchronous_commit on), every token drawn after the failover is larger
// than every token drawn before it. The leader, A, campaigns with txlock's
// terms, then with pgxlock's; B with txlock's.
func TestLeaseFailover(t *testing.T) {
	for _, lib := range leaseLibs {
		t.Run(lib, func(t *testing.T) { testLeaseFailover(t, lib) })
	}
}

func testLeaseFailover(t *testing.T, lib string) {
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	standby := pgtest.NewSyncStandby(t, primary)
	leaks := newLeaks()
	oldAdmin := pool(t, primary.URL(), 2)
	newAdmin := pool(t, standby.URL(), 2)
	ctx := context.Background()
	var syncState, commit string
	require.NoError(t, oldAdmin.QueryRowContext(ctx, `SELECT (SELECT string_agg(sync_state, ',') FROM pg_stat_replication), current_setting('synchronous_commit')`).Scan(&syncState, &commit))
	require.Equal(t, "sync", syncState, "the standby must be synchronous")
	require.Equal(t, "on", commit)
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, oldAdmin))

	url := pgtest.FailoverURL(primary, standby)
	clA, dbB := newClient(t, lib, url, 4), pool(t, url, 4)
	key := leaseKey(t)

	// Tokens of several terms before the failover, the leader's last.
	before := leaseTokens(t, dbB, key, 5)
	var ev events
	a := campaign(t, "A", clA, key, nil, ev.observer())
	first := a.nextTerm(t, 30*time.Second, "before the failover")
	before = append(before, first.token)
	require.Equal(t, 1, heldOn(t, oldAdmin, key), "the leader's lock on the primary")
	b := campaign(t, "B", client{db: dbB}, key, nil)
	b.noTerm(t, 4*leaseBeat.Interval+anyPhase(), "while the leader holds")

	// 1. The primary crashes.
	start := time.Now()
	require.NoError(t, primary.Stop("immediate"))
	stopped := time.Since(start)
	// 3. (Observed here: it needs no promotion.)
	detected := lostWithin(t, first, start, leaseBeat.TTL+30*time.Second, "failover")
	assert.LessOrEqual(t, detected, leaseDetect+leaseSlack, "the leader must learn of the primary's stop within Interval+Timeout (%v) plus slack", leaseDetect)
	requireTermLost(t, &ev, first)
	a.noTerm(t, 4*leaseBeat.Interval, "with no primary")
	b.noTerm(t, 10*time.Millisecond, "with no primary")

	// 2. The standby is promoted.
	promote := time.Now()
	require.NoError(t, standby.Promote())
	promoted := time.Since(promote)

	// 4. A candidate wins on the new primary.
	var next *wonTerm
	var winner string
	select {
	case next = <-a.won:
		winner = "A"
	case next = <-b.won:
		winner = "B"
	case <-time.After(60 * time.Second):
		na, ea := a.failed()
		nb, eb := b.failed()
		t.Fatalf("no candidate won within 60s of the promotion (A: %d campaigns failed, the last with %v; B: %d, %v)", na, ea, nb, eb)
	}
	won := next.won.Sub(promote)
	require.NoError(t, next.term.Err())
	var inRecovery bool
	require.NoError(t, newAdmin.QueryRowContext(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery))
	require.False(t, inRecovery)
	require.Equal(t, 1, heldOn(t, newAdmin, key), "the new term's lock on the new primary")
	na, ea := a.failed()
	nb, eb := b.failed()
	t.Logf("failover: primary stopped in %v, the leader's context cancelled %v after the stop; standby promoted in %v; %s won %v after the promotion with token %d; campaigns failed meanwhile: A %d (last: %v), B %d (last: %v)",
		stopped.Round(time.Millisecond), detected.Round(time.Millisecond), promoted.Round(time.Millisecond), winner, won.Round(time.Millisecond), next.token, na, ea, nb, eb)
	assert.Positive(t, na+nb, "campaigns with no primary must fail")
	a.stop(t)
	b.stop(t)

	// Tokens after the failover: the winner's, then several terms more.
	after := append([]int64{next.token}, leaseTokens(t, dbB, key, 5)...)
	t.Logf("tokens before the failover %v, after it %v", before, after)
	for i := 1; i < len(before); i++ {
		require.Greater(t, before[i], before[i-1], "tokens before the failover must increase")
	}
	for _, tok := range after {
		assert.Greater(t, tok, before[len(before)-1], "a token drawn after the failover is not larger than every token drawn before it")
	}

	require.NoError(t, oldAdmin.Close())
	clA.finish(t, nil, leaks, newAdmin, dbB)
	figures(t, "lib=%s interval=%v timeout=%v leader_cancelled_after_stop=%v promoted_in=%v won_after_promotion=%v tokens_before=%v tokens_after=%v",
		lib, leaseBeat.Interval, leaseBeat.Timeout, detected.Round(time.Millisecond), promoted.Round(time.Millisecond), won.Round(time.Millisecond), before, after)
}

// TestLeaseReleaseInBlackhole ends a term whose connection is partitioned
// (the blackhole of TestLeaseBlackhole), where no rollback can reach the
// server: Release, given a context with a deadline, must return by that
// deadline, and Lead, whose fn returns, must return within the heartbeat's
// Timeout (both plus slack). Either way the server must end the term's
// session, and release the lock, within the TTL. Each runs twice: with a
// campaign context that cannot end, and with one that has a deadline (an
// hour away), with which the term's transaction once had no context of its
// own to cut the rollback off with, and both hung until the partition
// healed.
func TestLeaseReleaseInBlackhole(t *testing.T) {
	const deadline = time.Second
	// The partition begins halfway between two heartbeats, when none is
	// in flight: a heartbeat in flight would time out and close the
	// connection itself.
	midBeat := 2*leaseBeat.Interval + leaseBeat.Interval/2
	for _, c := range []struct {
		name  string
		bound time.Duration
		end   func(ctx context.Context, cl client, key txlock.Key, partition func()) error
	}{
		{"Release", deadline, func(ctx context.Context, cl client, key txlock.Key, partition func()) error {
			term, err := cl.acquireTerm(ctx, key, txlock.WithHeartbeat(leaseBeat), txlock.WithTimeout(30*time.Second))
			if err != nil {
				return err
			}
			time.Sleep(midBeat)
			if err := term.Err(); err != nil {
				return err
			}
			partition()
			rctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			return term.Release(rctx)
		}},
		{"Lead", leaseBeat.Timeout, func(ctx context.Context, cl client, key txlock.Key, partition func()) error {
			return cl.lead(ctx, key, func(ctx context.Context, term *txlock.Term) error {
				time.Sleep(midBeat)
				if err := term.Err(); err != nil {
					return err
				}
				partition()
				return nil
			}, txlock.WithHeartbeat(leaseBeat), txlock.WithTimeout(30*time.Second))
		}},
	} {
		for _, lib := range leaseLibs {
			t.Run(variant{lib, c.name}.name(), func(t *testing.T) {
				for _, withDeadline := range []bool{false, true} {
					sub := "no deadline"
					if withDeadline {
						sub = "ctx with a deadline"
					}
					t.Run(sub, func(t *testing.T) { testReleaseInBlackhole(t, lib, c.name, c.bound, c.end, withDeadline) })
				}
			})
		}
	}
}

func testReleaseInBlackhole(t *testing.T, lib, name string, bound time.Duration, end func(ctx context.Context, cl client, key txlock.Key, partition func()) error, withDeadline bool) {
	admin, px, dsn, leaks := setup(t, networkTargets[0])
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, admin))
	db := newClient(t, lib, dsn, 4) // through the proxy
	key := leaseKey(t)
	campaignCtx := ctx
	if withDeadline {
		var cancel context.CancelFunc
		campaignCtx, cancel = context.WithTimeout(ctx, time.Hour)
		defer cancel()
	}

	var start time.Time
	partitioned := make(chan struct{})
	partition := func() {
		px.add("blackhole", `{}`)
		start = time.Now()
		close(partitioned)
	}
	ended := make(chan error, 1)
	go func() { ended <- end(campaignCtx, db, key, partition) }()
	select {
	case <-partitioned:
	case err := <-ended:
		t.Fatalf("the term ended before the partition: %v", err)
	}
	// The server's side, watched meanwhile.
	freed := make(chan time.Duration, 1)
	go func() {
		for time.Since(start) < leaseBeat.TTL+30*time.Second {
			if heldOn(t, admin, key) == 0 {
				freed <- time.Since(start)
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		freed <- -1
	}()

	var returned time.Duration
	var err error
	select {
	case err = <-ended:
		returned = time.Since(start)
		t.Logf("%s in a blackhole returned after %v: %v", name, returned.Round(time.Millisecond), err)
	case <-time.After(bound + leaseSlack):
		returned = -1
		t.Errorf("%s in a blackhole had not returned after %v (bound %v plus slack)", name, bound+leaseSlack, bound)
	}
	f := <-freed
	t.Logf("the server released the lock %v into the blackhole (TTL %v)", f.Round(time.Millisecond), leaseBeat.TTL)
	assert.Positive(t, f, "the server did not release a partitioned term's lock")
	assert.LessOrEqual(t, f, leaseBeat.TTL+leaseSlack, "the server must release a partitioned term's lock within the TTL")

	px.clear()
	if returned < 0 {
		select {
		case err = <-ended:
			t.Logf("%s returned %v into the blackhole, once it was healed: %v", name, time.Since(start).Round(time.Millisecond), err)
		case <-time.After(30 * time.Second):
			t.Errorf("%s had not returned 30s after the blackhole was healed", name)
		}
	}
	px.stop()
	db.finish(t, nil, leaks, admin)
	ret := "never (until healed)"
	if returned >= 0 {
		ret = returned.Round(time.Millisecond).String()
	}
	figures(t, "lib=%s deadline=%t bound=%v returned_after=%s lock_freed_after=%v", lib, withDeadline, bound, ret, f.Round(time.Millisecond))
}

// TestLeaseCampaignInBlackhole partitions a candidate from PostgreSQL while
// it campaigns for a lock another session holds: its next attempt's BEGIN
// or statement is stuck on a pooled connection (or on a new one, whose
// startup vanishes too), and the attempt's bound, the TTL, must cut it off
// and end the campaign with an error that says so, rather than leave the
// candidate hanging until TCP gives up. The candidate campaigns with
// txlock's terms, then with pgxlock's.
func TestLeaseCampaignInBlackhole(t *testing.T) {
	for _, lib := range leaseLibs {
		t.Run(lib, func(t *testing.T) { testLeaseCampaignInBlackhole(t, lib) })
	}
}

func testLeaseCampaignInBlackhole(t *testing.T, lib string) {
	admin, px, dsn, leaks := setup(t, networkTargets[0])
	ctx := context.Background()
	require.NoError(t, txlock.Fencer{}.CreateSequence(ctx, admin))
	db := newClient(t, lib, dsn, 4) // through the proxy
	directDB := pool(t, pgtest.Postgres(t), 4)
	key := leaseKey(t)
	holder, err := txlock.AcquireTerm(ctx, directDB, key, txlock.WithHeartbeat(leaseBeat))
	require.NoError(t, err)

	busy := make(chan struct{}, 64)
	var lost []txlock.Event // TermLost events; read once the campaign has returned
	obs := txlock.WithObserver(txlock.ObserverFunc(func(ctx context.Context, e txlock.Event) context.Context {
		switch e.Kind {
		case txlock.Busy:
			select {
			case busy <- struct{}{}:
			default:
			}
		case txlock.TermLost:
			lost = append(lost, e)
		}
		return ctx
	}))
	ended := make(chan error, 1)
	go func() {
		term, err := db.acquireTerm(ctx, key, txlock.WithHeartbeat(leaseBeat), leasePoll, obs)
		if term != nil {
			_ = term.Release(ctx)
		}
		ended <- err
	}()
	for range 3 { // the candidate polls through the proxy
		select {
		case <-busy:
		case <-time.After(30 * time.Second):
			t.Fatal("the candidate made no busy attempt")
		}
	}
	px.add("blackhole", `{}`)
	start := time.Now()
	select {
	case err = <-ended:
	case <-time.After(leaseBeat.TTL + leaseSlack + 30*time.Second):
		t.Fatalf("the campaign had not ended %v into the blackhole", time.Since(start))
	}
	took := time.Since(start)
	t.Logf("the campaign ended %v into the blackhole (attempts bounded by the TTL, %v): %v", took.Round(time.Millisecond), leaseBeat.TTL, err)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the attempt did not return within "+leaseBeat.TTL.String())
	assert.NotErrorIs(t, err, txlock.ErrLockTimeout)
	assert.LessOrEqual(t, took, leaseBeat.TTL+leaseSlack, "the attempt must be cut off at the TTL, plus slack")
	assert.Empty(t, lost, "TermLost for a term never granted")

	px.clear()
	require.NoError(t, holder.Release(ctx))
	px.stop()
	db.finish(t, nil, leaks, admin, directDB)
	figures(t, "lib=%s ttl=%v campaign_ended_after=%v", lib, leaseBeat.TTL, took.Round(time.Millisecond))
}
