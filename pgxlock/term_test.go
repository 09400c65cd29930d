package pgxlock_test

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// Terms on pgx: the database/sql forms' tests (term_test.go in the root
// package) hold for them too; these show that each step reaches the server
// through pgx: the campaign, the heartbeats, the loss and the release.

// fastBeat is the root tests' heartbeat for the tests that see a term end:
// quick, with a Timeout and a TTL above a loaded machine's pauses.
var fastBeat = txlock.Heartbeat{Interval: 200 * time.Millisecond, Timeout: 2 * time.Second, TTL: 4 * time.Second}

var heldBy = locktest.HeldBy

// termPool returns a pgx pool on url in mode, and a database/sql pool on
// the server where the fencing sequence exists.
func termPool(t *testing.T, url, mode string) (*pgxpool.Pool, *sql.DB) {
	t.Helper()
	_, admin := direct(t)
	require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
	return newPool(t, url, mode, 4), admin
}

// A term holds its lock across heartbeats, directly and through PgBouncer
// in a mode that prepares statements, refuses a second candidate, and
// releases the lock at Release; the next term's token is larger.
func TestTermHoldsAndReleases(t *testing.T) {
	for _, via := range []struct{ name, url, mode string }{
		{"direct", pgtest.Postgres(t), ""},
		{"PgBouncer", bouncerURL(t), "cache_statement"},
	} {
		t.Run(via.name, func(t *testing.T) {
			pool, admin := termPool(t, via.url, via.mode)
			ctx := context.Background()
			key := txlock.StringKey(uniq(t))
			term, err := pgxlock.AcquireTerm(ctx, pool, key, txlock.WithHeartbeat(fastBeat))
			require.NoError(t, err)
			t.Cleanup(func() { _ = term.Release(ctx) })
			assert.Equal(t, key, term.Key())
			assert.Positive(t, term.Token())
			tok, err := txlock.FenceToken(term.Context())
			require.NoError(t, err)
			assert.Equal(t, term.Token(), tok)
			lock, ok := txlock.LockFromContext(term.Context())
			require.True(t, ok)
			assert.Equal(t, []txlock.Key{key}, lock.Keys)

			time.Sleep(5 * fastBeat.Interval)
			require.NoError(t, term.Err(), "the heartbeats kept the term")
			assert.Equal(t, 1, heldBy(t, admin, key))
			other, err := pgxlock.TryAcquireTerm(ctx, pool, key)
			require.NoError(t, err)
			assert.Nil(t, other, "a second term of the same key")
			var inTx string
			require.NoError(t, admin.QueryRow(`SELECT state FROM pg_stat_activity WHERE pid = $1`, locktest.HolderPID(t, admin, key)).Scan(&inTx))
			assert.Equal(t, "idle in transaction", inTx)

			require.NoError(t, term.Release(ctx))
			assert.ErrorIs(t, term.Err(), txlock.ErrTermReleased)
			assert.Equal(t, 0, heldBy(t, admin, key), "the lock outlived Release")
			next, err := pgxlock.AcquireTerm(ctx, pool, key, txlock.WithTimeout(5*time.Second))
			require.NoError(t, err)
			assert.Greater(t, next.Token(), term.Token())
			require.NoError(t, next.Release(ctx))
		})
	}
}

// bouncerURL returns the test PgBouncer's URL.
func bouncerURL(t *testing.T) string {
	url, _ := pgtest.PgBouncer(t)
	return url
}

// A terminated backend ends the term within a heartbeat interval plus its
// timeout (2s more allowed for a loaded machine), with ErrLockLost, and
// the lock is free for the next candidate.
func TestTermTerminated(t *testing.T) {
	pool, admin := termPool(t, pgtest.Postgres(t), "")
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	term, err := pgxlock.AcquireTerm(ctx, pool, key, txlock.WithHeartbeat(fastBeat))
	require.NoError(t, err)
	var ok bool
	require.NoError(t, admin.QueryRow(`SELECT pg_terminate_backend($1)`, locktest.HolderPID(t, admin, key)).Scan(&ok))
	killed := time.Now()
	select {
	case <-term.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the term's context was not cancelled after its backend was terminated")
	}
	assert.Less(t, time.Since(killed), fastBeat.Interval+fastBeat.Timeout+2*time.Second)
	require.ErrorIs(t, term.Err(), txlock.ErrLockLost)
	assert.Contains(t, term.Err().Error(), "heartbeat failed")
	require.NoError(t, term.Release(ctx), "Release after a loss")
	next, err := pgxlock.TryAcquireTerm(ctx, pool, key)
	require.NoError(t, err)
	require.NotNil(t, next, "the lock is free once the backend is gone")
	require.NoError(t, next.Release(ctx))
}

// Lead runs fn with the term, returns fn's error, and releases the term;
// a loss reaches fn's context, and Lead's error joins it with fn's. The
// Locker's Lead and a nil fn behave alike. Directly and through PgBouncer.
func TestLead(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			url, mode := pgtest.Postgres(t), ""
			if via == "PgBouncer" {
				url, mode = bouncerURL(t), "exec"
			}
			pool, admin := termPool(t, url, mode)
			testLead(t, pool, admin)
		})
	}
}

func testLead(t *testing.T, pool *pgxpool.Pool, admin *sql.DB) {
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	fnErr := errors.New("fn's error")
	err := pgxlock.Lead(ctx, pool, key, func(ctx context.Context, term *txlock.Term) error {
		tok, err := txlock.FenceToken(ctx)
		require.NoError(t, err)
		assert.Equal(t, term.Token(), tok)
		assert.Equal(t, 1, heldBy(t, admin, key))
		return fnErr
	})
	assert.Equal(t, fnErr, err)
	assert.Equal(t, 0, heldBy(t, admin, key))

	l, err := pgxlock.New(pool)
	require.NoError(t, err)
	err = l.Lead(ctx, key, func(ctx context.Context, term *txlock.Term) error {
		var ok bool
		require.NoError(t, admin.QueryRow(`SELECT pg_terminate_backend($1)`, locktest.HolderPID(t, admin, key)).Scan(&ok))
		select {
		case <-ctx.Done():
		case <-time.After(10 * time.Second):
			t.Error("fn's context was not cancelled")
		}
		return fnErr
	}, txlock.WithHeartbeat(fastBeat))
	assert.ErrorIs(t, err, txlock.ErrLockLost)
	assert.ErrorIs(t, err, fnErr)

	assert.ErrorIs(t, pgxlock.Lead(ctx, pool, key, nil), txlock.ErrInvalidArgument)
	assert.ErrorIs(t, l.Lead(ctx, key, nil), txlock.ErrInvalidArgument)
}

// Two candidates on one pool: the second waits, and is elected when the
// first term ends. A Locker's TryAcquireTerm finds the lock busy
// meanwhile.
func TestTermLocalQueue(t *testing.T) {
	pool, _ := termPool(t, pgtest.Postgres(t), "")
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	l, err := pgxlock.New(pool)
	require.NoError(t, err)
	first, err := l.AcquireTerm(ctx, key, txlock.WithHeartbeat(fastBeat))
	require.NoError(t, err)
	got := make(chan *txlock.Term, 1)
	go func() {
		term, err := l.AcquireTerm(ctx, key, txlock.WithTimeout(10*time.Second))
		assert.NoError(t, err)
		got <- term
	}()
	busy, err := l.TryAcquireTerm(ctx, key)
	require.NoError(t, err)
	assert.Nil(t, busy)
	time.Sleep(300 * time.Millisecond)
	select {
	case <-got:
		t.Fatal("a second term while the first holds")
	default:
	}
	require.NoError(t, first.Release(ctx))
	second := <-got
	require.NotNil(t, second)
	assert.Greater(t, second.Token(), first.Token())
	require.NoError(t, second.Release(ctx))
}

// What a term refuses, pgx refuses: an option that does not apply to a
// term, also from a Locker's New, which the error then names, and a nil
// pool. (A term takes a pool, whose second connection draws its token:
// pgx's single connections do not compile there.)
func TestTermRefusals(t *testing.T) {
	pool, admin := termPool(t, pgtest.Postgres(t), "")
	ctx := context.Background()
	key := txlock.StringKey(uniq(t))
	_, err := pgxlock.AcquireTerm(ctx, pool, key, txlock.WithShared())
	defer func() { assert.Equal(t, 0, heldBy(t, admin, key), "a refused term left its lock") }()
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "WithShared does not apply to a term")
	l, err := pgxlock.New(pool, txlock.WithMaxHold(time.Second))
	require.NoError(t, err)
	_, err = l.AcquireTerm(ctx, key)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "WithMaxHold was given to New")
	_, err = pgxlock.TryAcquireTerm(ctx, nil, key)
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorIs(t, pgxlock.Lead(ctx, nil, key, func(context.Context, *txlock.Term) error { return nil }), txlock.ErrInvalidArgument)
}

// Release with a context that has ended sends no rollback: it closes the
// term's connection, which ends the lock, and says so.
func TestTermReleaseEndedCtx(t *testing.T) {
	pool, admin := termPool(t, pgtest.Postgres(t), "")
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	key := txlock.StringKey(uniq(t))
	term, err := pgxlock.AcquireTerm(context.Background(), pool, key, txlock.WithHeartbeat(fastBeat))
	require.NoError(t, err)
	err = term.Release(ended)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "the rollback was cut off, as Release's ctx had ended")
	require.Eventually(t, func() bool { return heldBy(t, admin, key) == 0 }, 5*time.Second, 10*time.Millisecond,
		"the lock outlived the closed connection")
	assert.NoError(t, term.Release(context.Background()), "a second Release")
}
