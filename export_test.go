package txlock

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/txlock/txlock/driver"
)

// PgLocksOf exposes Key.pgLocks to the external tests.
func PgLocksOf(k Key) (classid, objid uint32, objsubid int) { return k.pgLocks() }

// LockStatement exposes lockStatement to the external tests.
func LockStatement(keys []Key, shared bool, maxHold time.Duration, f stmtForm) string {
	return lockStatement(lockSpec{keys: keys, shared: shared, maxHold: maxHold, readWrite: f == formOwnTx}, f)
}

// QuoteIdent exposes quoteIdent to the external tests.
var QuoteIdent = quoteIdent

// Queues reports how many local queues exist.
func Queues() int {
	queues.Lock()
	defer queues.Unlock()
	return len(queues.m)
}

// QueueRefs reports how many calls are queued in, or hold the turn of, the
// local queues.
func QueueRefs() int { return queuedCallers() }

// SetMaxEarlyBegin sets maxEarlyBegin to d until t ends.
func SetMaxEarlyBegin(t *testing.T, d time.Duration) { setUntilEnd(t, &maxEarlyBegin, d) }

// SetWindowMargin sets windowMargin to d until t ends.
func SetWindowMargin(t *testing.T, d time.Duration) { setUntilEnd(t, &windowMargin, d) }

// setUntilEnd sets *p to v until t ends. The root package's tests do not
// run in parallel, so no other test sees v.
func setUntilEnd[T any](t *testing.T, p *T, v T) {
	was := *p
	*p = v
	t.Cleanup(func() { *p = was })
}

// BenchEvents runs b.N rounds of the lock loop through an attempter that is
// granted at once and a holder that does nothing, with o as the Observer:
// what the events cost, without a database.
func BenchEvents(b *testing.B, o Observer) {
	c := &config{}
	if err := c.init([]Option{WithObserver(o)}, false); err != nil {
		b.Fatal(err)
	}
	keys := []Key{Int64Key(1)}
	a := grantAtOnce{}
	p := &plan{c: c, a: a, keys: keys}
	b.ReportAllocs()
	st := &lockState{}
	var ev events
	for b.Loop() {
		ev.start(o, context.Background())
		*st = lockState{lock: Lock{Keys: keys, Held: true}, ev: ev.orNil()}
		if _, err := lockLoop(context.Background(), c, c.waitMode(false), p, a, nil, st); err != nil {
			b.Fatal(err)
		}
	}
}

type grantAtOnce struct{}

func (grantAtOnce) Attempt(context.Context, driver.Request) (driver.Result, error) {
	return driver.Result{Tx: fakeTx{}, Rows: 1}, nil
}
func (grantAtOnce) hold(*lockState, func()) error                  { return nil }
func (grantAtOnce) holdUnlocked(context.Context, *lockState) error { return nil }
func (grantAtOnce) pooled() bool                                   { return false }

// AgeTerm makes t's last successful heartbeat look d old, as if the holder
// had been frozen for d.
func AgeTerm(t *Term, d time.Duration) { t.lastOK.Store(int64(t.since() - d)) }

// The statement forms, for LockStatement.
const (
	FormOwnTx    = formOwnTx
	FormCallerTx = formCallerTx
)

// OwnTxAttempt runs in tx the statement of an attempt in a transaction of
// txlock's own, begun READ ONLY or not (readOnly), and returns its outcome
// as the engine decodes it: "busy", "granted" or "standby". kind is "poll",
// "semaphore" (keys are its slots) or "server wait".
func OwnTxAttempt(ctx context.Context, tx *sql.Tx, kind string, keys []Key, readOnly bool) (string, error) {
	c := &config{}
	opts := []Option{}
	if readOnly {
		opts = append(opts, WithTxOptions(&sql.TxOptions{ReadOnly: true}))
	}
	if err := c.init(opts, false); err != nil {
		return "", err
	}
	s := c.specOf(keys, formOwnTx)
	var stmt string
	switch kind {
	case "poll":
		stmt = lockStatement(s, formOwnTx)
	case "semaphore":
		c.slots, s.slots = len(keys), true
		stmt = lockStatement(s, formOwnTx)
	case "server wait":
		stmt = quietWaitStatement(s, time.Second)
	default:
		return "", fmt.Errorf("OwnTxAttempt: no kind %q", kind)
	}
	// As plan.settle decodes the answer.
	var out outcome
	res, err := tx.ExecContext(ctx, stmt)
	if err != nil {
		out, err = (&plan{c: c, keys: keys}).classify(err)
	} else if n, rerr := res.RowsAffected(); rerr != nil {
		return "", fmt.Errorf("txlock: lock statement result: %w", rerr)
	} else {
		var slot int
		out, err = c.decodeRows(n, &slot)
	}
	return [...]string{busy: "busy", granted: "granted", standby: "standby", again: "again"}[out], err
}
