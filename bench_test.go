package txlock_test

import (
	"context"
	"database/sql"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

// The hot paths. Compare BenchmarkWithLockUncontended with
// BenchmarkPlainTx: the difference is the cost of the lock (one round trip,
// and the allocations reported by -benchmem). cmd/txlock-bench measures
// contention and the alternatives.

func benchSelect(ctx context.Context, tx *sql.Tx) error {
	var one int
	return tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one)
}

func BenchmarkPlainTx(b *testing.B) { benchPlainTx(b, context.Background()) }

func BenchmarkWithLockUncontended(b *testing.B) { benchWithLock(b, context.Background()) }

// With a cancellable context, as a request handler has: database/sql then
// watches the context of every transaction, with or without the lock.
func BenchmarkPlainTxCancelCtx(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchPlainTx(b, ctx)
}

func BenchmarkWithLockUncontendedCancelCtx(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchWithLock(b, ctx)
}

func BenchmarkStringKey(b *testing.B) {
	name := "orders:" + strconv.Itoa(42)
	for b.Loop() {
		_ = txlock.StringKey(name)
	}
}

func BenchmarkKeyspaceKey(b *testing.B) {
	ks := txlock.NewKeyspace("billing")
	for b.Loop() {
		_ = ks.Key("invoice-7")
	}
}

func BenchmarkLockStatement(b *testing.B) {
	keys := []txlock.Key{txlock.StringKey("orders:42")}
	for b.Loop() {
		_ = txlock.LockStatement(keys, false, 0, txlock.FormOwnTx)
	}
}

func BenchmarkExponentialBackoff(b *testing.B) {
	s := txlock.ExponentialBackoff{}
	n := 0
	for b.Loop() {
		n++
		_ = s.Backoff(n%12 + 1)
	}
}

func BenchmarkLinearBackoff(b *testing.B) {
	s := txlock.LinearBackoff{Step: time.Millisecond, Max: 50 * time.Millisecond, Jitter: time.Millisecond}
	n := 0
	for b.Loop() {
		n++
		_ = s.Backoff(n%60 + 1)
	}
}

// With a context whose deadline comes before the lock's timeout, as a
// request handler's usually does (a 2s request deadline, the 5s default
// timeout): the first attempt needs no timer of its own. The benchmark
// scales both up so that they outlast it.
func BenchmarkPlainTxDeadlineCtx(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchPlainTx(b, ctx)
}

func BenchmarkWithLockUncontendedDeadlineCtx(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchWithLock(b, ctx, txlock.WithTimeout(2*time.Hour))
}

// The plain transaction plus WithLock's lock statement, sent by hand: what
// the one extra statement costs by itself, with nothing else of WithLock.
func BenchmarkPlainTxLockStatement(b *testing.B) {
	benchPlainTx(b, context.Background(), txlock.StringKey(uniq(b)))
}

func BenchmarkPlainTxLockStatementDeadlineCtx(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	benchPlainTx(b, ctx, txlock.StringKey(uniq(b)))
}

// benchPlainTx measures the guarded work in a plain transaction under ctx,
// after the lock statement of key if one is given.
func benchPlainTx(b *testing.B, ctx context.Context, key ...txlock.Key) {
	db := direct(b)
	stmt := ""
	if len(key) > 0 {
		stmt = txlock.LockStatement(key, false, 0, txlock.FormOwnTx)
	}
	for b.Loop() {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(b, err)
		if stmt != "" {
			_, err := tx.ExecContext(ctx, stmt)
			require.NoError(b, err)
		}
		require.NoError(b, benchSelect(ctx, tx))
		require.NoError(b, tx.Commit())
	}
}

// benchWithLock measures the same work under an uncontended WithLock.
func benchWithLock(b *testing.B, ctx context.Context, opts ...txlock.Option) {
	db := direct(b)
	key := txlock.StringKey(uniq(b))
	for b.Loop() {
		require.NoError(b, txlock.WithLock(ctx, db, key, benchSelect, opts...))
	}
}

// The cost of the lock events: with no Observer (the default, which costs
// nothing: compare with BenchmarkWithLockUncontended of a build without
// events) and with one that does nothing.
func BenchmarkWithLockUncontendedNoObserver(b *testing.B) {
	benchWithLock(b, context.Background(), txlock.WithObserver(nil))
}

func BenchmarkWithLockUncontendedNopObserver(b *testing.B) {
	nop := txlock.ObserverFunc(func(ctx context.Context, _ txlock.Event) context.Context { return ctx })
	benchWithLock(b, context.Background(), txlock.WithObserver(nop))
}

// The events themselves, without a database: a WithLock that is granted at
// once, with and without an Observer.
func BenchmarkEventsOff(b *testing.B) { txlock.BenchEvents(b, nil) }

func BenchmarkEventsNop(b *testing.B) {
	txlock.BenchEvents(b, txlock.ObserverFunc(func(ctx context.Context, _ txlock.Event) context.Context { return ctx }))
}

// The cost of naming the holder: compare with BenchmarkWithLockUncontended.
func BenchmarkWithLockUncontendedOwner(b *testing.B) {
	benchWithLock(b, context.Background(), txlock.WithOwner("export-worker host-a pid 42 req 7f3a"))
}
