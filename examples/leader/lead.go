package main

// This file is the part of the example to copy: leader election with
// txlock.Lead, and the leader's writes fenced with its term's token. The rest
// of the program is the demo around it.

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/txlock/txlock"
)

// leaderKey is the election's lock: one key for the whole service.
var leaderKey = txlock.StringKey("examples/leader:scheduler")

// state is the shared state the leader writes, fenced.
var state = txlock.FencedTable{Name: "leader_state"}

// lead campaigns for leaderKey once: it waits until elected, leads for the
// term, and returns the term's token (0 if never elected) and Lead's error,
// which matches txlock.ErrLockLost if the term was lost. Call it in a loop to
// stay a candidate, as runChild does. The leader writes its pid and a step
// count to state every work, with the term's token; say reports its doings.
//
// A heartbeat every fifth of the TTL, each allowed until the term's local
// expiry (a Timeout of the TTL), keeps a slow one on a loaded machine from
// ending a healthy term: only the TTL passing without a successful
// heartbeat does.
func lead(ctx context.Context, db *sql.DB, pid int, ttl, work time.Duration, say func(format string, args ...any)) (token int64, err error) {
	start := time.Now()
	err = txlock.Lead(ctx, db, leaderKey, func(termCtx context.Context, term *txlock.Term) error {
		token = term.Token()
		say("won the term with token %d, after campaigning for %v", token, time.Since(start).Round(time.Millisecond))
		for step := 0; ; step++ {
			// One step of work, which does not look at termCtx, then its
			// result, written outside the term's transaction with the
			// term's token. The write's context is the process's: the write
			// is not tied to the term, which is why it is fenced.
			time.Sleep(work)
			_, err := state.Update(ctx, db, token, []txlock.Col{{Name: "leader_pid", Value: pid}, {Name: "step", Value: step}},
				[]txlock.Col{{Name: "id", Value: 1}})
			if errors.Is(err, txlock.ErrStaleToken) {
				say("write with token %d refused: %v", token, err)
				return err
			}
			if err != nil {
				return err
			}
			if step == 0 {
				say("writing leader_state every %v with token %d", work, token)
			}
			if termCtx.Err() != nil {
				return context.Cause(termCtx)
			}
		}
	}, txlock.WithHeartbeat(txlock.Heartbeat{Interval: ttl / 5, Timeout: ttl, TTL: ttl}))
	return token, err
}
