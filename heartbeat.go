package txlock

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Heartbeats: how a term proves it is alive, and how it finds out that it
// is not. The term's goroutine (beat) runs one short statement every
// Interval; a failure, or no success for the TTL (checkExpiry), loses the
// term. The server bounds it too, with the TTL as the transaction's
// idle_in_transaction_session_timeout, which the term's lock statement
// (termStatement, at the end of this file) sets.

// Defaults of a Heartbeat's zero fields (see Heartbeat).
const (
	heartbeatInterval     = time.Second
	heartbeatTTLIntervals = 3
)

// Defaults of a campaign's polling (see AcquireTerm). A campaign can last
// for hours, so it polls less often than WithLock; a resigned term's
// successor is elected within one poll of the candidates.
const (
	campaignBackoffMin = 10 * time.Millisecond
	campaignBackoffMax = 500 * time.Millisecond
)

// Heartbeat configures how a term proves that it is alive (WithHeartbeat).
// Its zero value means the defaults: a heartbeat every second, each bounded
// by a second, and a TTL of three seconds.
//
// Every Interval the term runs a short statement (SELECT 1) on its
// transaction, bounded by Timeout. One that fails (a terminated backend, a
// dead server, a PgBouncer restart) or times out (a partition) ends the
// term: its context is cancelled with a cause that matches ErrLockLost. A
// heartbeat that times out closes its connection (pgx does so when a query's
// context ends), so a term never survives one: keep Timeout well above the
// pauses the machine can have (a loaded machine stalls for a second at
// times), or such a pause ends a healthy term.
//
// The loss is detected, not foreseen: a lock that the server dropped (a
// terminated backend, say) is noticed by the next heartbeat, up to
// Interval+Timeout later, and meanwhile another session can be granted the
// lock while this term's context is not yet cancelled. Two holders can
// overlap for that window (within the TTL for a frozen holder), which is why
// a write made outside the term's transaction must be fenced (Term.Token).
//
// TTL bounds a term on both sides. On the server,
// idle_in_transaction_session_timeout is set to it for the term's
// transaction: a holder that freezes (a stopped process, a stalled VM, a
// partition) loses its session, and with it the lock, TTL after its last
// heartbeat, and the next candidate is elected. On the client, a term
// whose last successful heartbeat was sent TTL ago or more (less a
// hundredth of the TTL, for clocks that run at slightly different rates)
// counts as lost, even if its goroutine could not run meanwhile: the
// term's context's own Done, Err and Value methods check, as do Held,
// Term.Err and Term.Done, so a holder that was frozen for longer sees its
// term ended as soon as it looks there. A context derived from the term's
// with a cancel of its own (context.WithCancel, WithTimeout, an errgroup's)
// does not check: it is cancelled only once something has noticed the
// expiry (the heartbeat goroutine does when it next runs). Check Held(ctx)
// or Term.Err right before each write outside the term, and fence it. The
// client counts from the moment the heartbeat was sent, which is before
// the server received it, so it gives up before the server does (on the
// monotonic clock; a machine that is suspended as a whole may stop that
// clock: fence the writes, see Term.Token).
type Heartbeat struct {
	// Interval is the time between heartbeats. Zero means 1s.
	Interval time.Duration
	// Timeout bounds each heartbeat statement. Zero means Interval. A
	// heartbeat never waits past the term's local expiry, whatever Timeout
	// says.
	Timeout time.Duration
	// TTL is how long a term survives without a successful heartbeat. Zero
	// means 3 times Interval. It must be at
	// least twice Interval: the session is idle for an interval between
	// two heartbeats, and a late one must not end a healthy term. It must
	// not exceed 2147483647ms (about 24.8 days), the largest
	// idle_in_transaction_session_timeout the server accepts. Every pooler
	// or proxy idle limit on the way (PgBouncer's idle_transaction_timeout)
	// must exceed it.
	TTL time.Duration
}

// withDefaults returns h with its zero fields set.
func (h Heartbeat) withDefaults() Heartbeat {
	if h.Interval == 0 {
		h.Interval = heartbeatInterval
	}
	if h.Timeout == 0 {
		h.Timeout = h.Interval
	}
	if h.TTL == 0 {
		h.TTL = heartbeatTTLIntervals * h.Interval
	}
	return h
}

// Validate reports negative fields, and a TTL shorter than two intervals.
func (h Heartbeat) Validate() error {
	if h.Interval < 0 || h.Timeout < 0 || h.TTL < 0 {
		return fmt.Errorf("txlock: Heartbeat fields must not be negative (Interval %v, Timeout %v, TTL %v)", h.Interval, h.Timeout, h.TTL)
	}
	d := h.withDefaults()
	if d.TTL < 2*d.Interval {
		return fmt.Errorf("txlock: Heartbeat TTL %v must be at least twice Interval %v: a session is idle for an interval between heartbeats, and the server ends it after TTL", d.TTL, d.Interval)
	}
	if d.TTL < time.Millisecond {
		return fmt.Errorf("txlock: Heartbeat TTL %v is below the server's 1ms resolution", d.TTL)
	}
	if ceilMillis(d.TTL) > math.MaxInt32 {
		return fmt.Errorf("txlock: Heartbeat TTL %v is above 2147483647ms (about 24.8 days), the largest idle_in_transaction_session_timeout the server accepts: the server would end the session before the TTL", d.TTL)
	}
	return nil
}

// localTTL is how long after its last successful heartbeat was sent the
// client counts a term as lost: the TTL less a hundredth, so that a client
// clock that runs a little slower than the server's still gives up first.
func (h Heartbeat) localTTL() time.Duration { return h.TTL - h.TTL/100 }

// WithHeartbeat sets the heartbeat of a term (AcquireTerm, TryAcquireTerm,
// Lead): see Heartbeat.
func WithHeartbeat(h Heartbeat) TermOption {
	return termOption(func(c *config) {
		if err := h.Validate(); err != nil {
			c.fail("%s", trimPrefix(err))
		}
		c.heartbeat = h
	})
}

// since is the time since the lock statement was sent, on the monotonic
// clock.
func (t *Term) since() time.Duration { return time.Since(t.start) }

// checkExpiry ends the term as lost if its last successful heartbeat was
// sent localTTL ago or more.
func (t *Term) checkExpiry() {
	if t.tc.Context.Err() != nil {
		// Already cancelled. (Not t.losing: another goroutine may have
		// set it and not yet cancelled, and this caller, which reads the
		// context next, must find it cancelled.)
		return
	}
	now := t.since()
	last := time.Duration(t.lastOK.Load())
	if now-last < t.hb.localTTL() {
		return
	}
	if !t.begun.Load() {
		t.lose(fmt.Errorf("%w: term of %s: its start (drawing the fencing token, on a free connection of the pool, and the first heartbeat) took %v, past the TTL of %v, after which the server ends the session", ErrLockLost, t.key, now.Round(time.Millisecond), t.hb.TTL))
		return
	}
	t.lose(fmt.Errorf("%w: term of %s (token %d): no heartbeat succeeded for %v, past the TTL of %v, after which the server ends the session", ErrLockLost, t.key, t.token.Load(), (now - last).Round(time.Millisecond), t.hb.TTL))
}

// beat is the term's heartbeat goroutine: it runs the heartbeats, and ends
// the term when its context ends (a loss, or the caller's context), or
// returns when Release asks, which then ends the term itself.
func (t *Term) beat() {
	defer close(t.beatDone)
	base := t.tc.Context
	timer := time.NewTimer(t.hb.Interval)
	defer timer.Stop()
	for {
		select {
		case <-t.stop:
			return
		case <-base.Done():
			select {
			case <-t.stop: // Release ends the term, with its own ctx
			default:
				t.finish(context.Background(), context.Cause(base))
			}
			return
		case <-timer.C:
		}
		sent := t.since()
		left := t.hb.localTTL() - (sent - time.Duration(t.lastOK.Load()))
		if left <= 0 {
			t.checkExpiry()
			continue
		}
		hctx, cancel := context.WithTimeout(base, min(t.hb.Timeout, left))
		err := t.tx.Exec(hctx, heartbeatStatement)
		cancel()
		if err != nil {
			if base.Err() == nil {
				t.lose(fmt.Errorf("%w: term of %s (token %d): heartbeat failed after %v: %w", ErrLockLost, t.key, t.token.Load(), (t.since() - sent).Round(time.Millisecond), err))
			}
			continue
		}
		t.lastOK.Store(int64(sent))
		timer.Reset(t.hb.Interval)
	}
}

// termStatement builds the statement of a term's attempt (see AcquireTerm):
// lockStatement's first form for one exclusive key, in txlock's own
// transaction, which also refuses a transaction above read committed, sets
// idle_in_transaction_session_timeout to the term's TTL before the lock, and,
// once the lock is granted, turns off transaction_timeout where the server
// has it (PostgreSQL 17 and later):
//
//	SELECT 1 WHERE CASE
//	  WHEN pg_catalog.pg_is_in_recovery() THEN ...
//	  WHEN pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) ANY (ARRAY['repeatable read', 'serializable'])
//	    THEN CAST(pg_catalog.set_config('txlock.isolation', pg_catalog.concat('<termIsolationMarker>', <the level>), true) AS integer) IS NULL
//	  WHEN pg_catalog.set_config('idle_in_transaction_session_timeout', '<ttl ms>', true) IS NULL THEN false
//	  WHEN NOT (pg_catalog.pg_try_advisory_xact_lock('k'::bigint)) THEN false
//	  WHEN CASE WHEN pg_catalog.current_setting('transaction_timeout', true) IS NULL THEN false
//	    ELSE pg_catalog.set_config('transaction_timeout', '0', true) IS NULL END THEN false
//	  ELSE true END
//
// Above read committed the transaction's snapshot would hold back vacuum for
// the whole term (backend_xmin stays set); AcquireTerm begins the
// transaction at read committed, and the isolation branch catches a
// DB that does not pass that on, where the server's
// default_transaction_isolation would apply. A transaction_timeout in force
// (from the server, role, database or connection) is stopped by setting it
// to 0: a term lasts as long as its heartbeats succeed, and the idle bound
// ends a frozen one. With a holder's label (WithOwner), a last branch sets
// application_name, for the whole term (see appendOwner).
func termStatement(key Key, ttl time.Duration, owner string) string {
	b := make([]byte, 0, 1024)
	b = append(b, "SELECT 1 WHERE CASE WHEN pg_catalog.pg_is_in_recovery() THEN CAST(pg_catalog.set_config('txlock.in_recovery', '"+standbyMarker+"', true) AS integer) IS NULL"+
		" WHEN pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) ANY (ARRAY['repeatable read', 'serializable'])"+
		" THEN CAST(pg_catalog.set_config('txlock.isolation', pg_catalog.concat('"+termIsolationMarker+"', pg_catalog.current_setting('transaction_isolation')), true) AS integer) IS NULL"...)
	b = appendHoldBound(b, ttl, " THEN false")
	b = append(b, " WHEN NOT (pg_catalog.pg_try_advisory_xact_lock("...)
	b = appendSQLArgs(b, key)
	b = append(b, ")) THEN false"+
		" WHEN CASE WHEN pg_catalog.current_setting('transaction_timeout', true) IS NULL THEN false"+
		" ELSE pg_catalog.set_config('transaction_timeout', '0', true) IS NULL END THEN false"...)
	b = appendOwner(b, owner, " THEN false")
	b = append(b, " ELSE true END"...)
	return string(b)
}

// heartbeatStatement is a term's heartbeat: the shortest statement there
// is. It names nothing that a search_path could shadow, and every statement
// restarts the server's idle_in_transaction_session_timeout.
const heartbeatStatement = "SELECT 1"
