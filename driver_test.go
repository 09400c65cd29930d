package txlock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/driver"
)

// fakeDriver answers each attempt with the next of its results, and
// records what the lock loop did with each transaction.
type fakeDriver struct {
	results []driver.Result
	sent    []driver.Request
	log     []string
}

func (d *fakeDriver) Attempt(_ context.Context, a driver.Request) (driver.Result, error) {
	d.sent = append(d.sent, a)
	if len(d.results) == 0 {
		return driver.Result{}, errors.New("fake: no more results")
	}
	r := d.results[0]
	d.results = d.results[1:]
	return r, nil
}

func (d *fakeDriver) BeginUnlocked(context.Context, string) (driver.Tx, error) {
	return nil, errors.New("fake: no unlocked transactions")
}

func (d *fakeDriver) Pool() driver.PoolKey { return driver.PoolKey{} }
func (d *fakeDriver) IdleConn() bool       { return false }

// tx returns a transaction that logs under name.
func (d *fakeDriver) tx(name string) driver.Tx { return &fakeTx{d: d, name: name} }

type fakeTx struct {
	d           *fakeDriver
	name        string
	fn          func(ctx context.Context) error // what fn does, if not nil
	commitErr   error
	rollbackErr error
}

func (t *fakeTx) Fn(ctx context.Context) error {
	t.d.log = append(t.d.log, t.name+" fn")
	if t.fn != nil {
		return t.fn(ctx)
	}
	return nil
}

func (t *fakeTx) Commit(context.Context) error {
	t.d.log = append(t.d.log, t.name+" commit")
	return t.commitErr
}
func (t *fakeTx) Rollback() error {
	t.d.log = append(t.d.log, t.name+" rollback")
	return t.rollbackErr
}
func (t *fakeTx) Close() { t.d.log = append(t.d.log, t.name+" close") }

// The lock loop, not the driver, decides what a driver's answer means: a
// window's rows (0 busy, 1 granted, 2 a server in recovery), and ends each
// transaction that was not a grant. fn runs through the granted one, which
// the loop commits.
func TestDriverOutcomes(t *testing.T) {
	ctx := context.Background()
	key := txlock.Int64Key(1)
	wait := txlock.WithServerWait(txlock.ServerWait{Window: time.Millisecond})

	d := &fakeDriver{}
	d.results = []driver.Result{{Tx: d.tx("busy"), Rows: 0}, {Tx: d.tx("granted"), Rows: 1}}
	ok, err := txlock.DriverLock(ctx, d, []txlock.Key{key}, false, wait)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, []string{"busy rollback", "busy close", "granted fn", "granted commit", "granted close"}, d.log)
	require.Len(t, d.sent, 2)
	for _, a := range d.sent {
		assert.Equal(t, time.Millisecond, a.Window)
		assert.Contains(t, a.Stmt, "pg_catalog.pg_advisory_xact_lock")
		assert.Equal(t, "BEGIN", a.Begin)
		assert.Equal(t, a.Begin+"; "+a.Stmt, a.Query)
	}

	d = &fakeDriver{}
	d.results = []driver.Result{{Tx: d.tx("standby"), Rows: 2}}
	_, err = txlock.DriverLock(ctx, d, []txlock.Key{key}, false, wait)
	assert.ErrorIs(t, err, txlock.ErrStandby)
	assert.Equal(t, []string{"standby rollback", "standby close"}, d.log)

	// A polling attempt's rows decide too: none is a busy lock, which the
	// try reports, having ended its transaction; one is a grant. Its query
	// is BEGIN, then the lock statement. One that fails with an error that
	// is neither busy nor standby fails the call, with nothing left to end.
	d = &fakeDriver{}
	d.results = []driver.Result{{Tx: d.tx("busy")}}
	ok, err = txlock.DriverLock(ctx, d, []txlock.Key{key}, true)
	require.NoError(t, err)
	assert.False(t, ok)
	assert.Equal(t, []string{"busy rollback", "busy close"}, d.log)
	d = &fakeDriver{}
	d.results = []driver.Result{{Tx: d.tx("polled"), Rows: 1}}
	ok, err = txlock.DriverLock(ctx, d, []txlock.Key{key}, true)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, []string{"polled fn", "polled commit", "polled close"}, d.log)
	assert.Equal(t, "BEGIN; "+d.sent[0].Stmt, d.sent[0].Query)

	d = &fakeDriver{}
	boom := errors.New("fake: connection reset")
	d.results = []driver.Result{{Err: boom}}
	_, err = txlock.DriverLock(ctx, d, []txlock.Key{key}, true)
	assert.ErrorIs(t, err, boom)
	assert.Empty(t, d.log)
}

func TestDriverBadInput(t *testing.T) {
	ctx := context.Background()
	var nilDriver *fakeDriver
	for name, err := range map[string]error{
		"nil acquirer": func() error {
			_, err := txlock.DriverLock(ctx, nil, []txlock.Key{txlock.Int64Key(1)}, false)
			return err
		}(),
		"typed nil acquirer": func() error {
			_, err := txlock.DriverLock(ctx, nilDriver, []txlock.Key{txlock.Int64Key(1)}, false)
			return err
		}(),
		"no keys": func() error { _, err := txlock.DriverLock(ctx, &fakeDriver{}, nil, false); return err }(),
		"bad option": func() error {
			_, err := txlock.DriverLock(ctx, &fakeDriver{}, []txlock.Key{txlock.Int64Key(1)}, false, txlock.WithTimeout(-1))
			return err
		}(),
		"nil tx": func() error { _, err := txlock.DriverLockTx(ctx, nil, txlock.Int64Key(1), false); return err }(),
	} {
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument, name)
	}
}

// fakeDrawer is a fakeDriver that says it can set draw connections aside,
// on the pool of its key.
type fakeDrawer struct {
	fakeDriver
	pool driver.PoolKey
}

func (d *fakeDrawer) Pool() driver.PoolKey { return d.pool }
func (d *fakeDrawer) OpenDraw() (func(context.Context) (driver.DrawConn, error), error) {
	return func(context.Context) (driver.DrawConn, error) { return nil, errors.New("fake: no draws") }, nil
}

// What a driver leaves out, or gets wrong, the lock loop reports as an
// error, and never as a panic or a lock: a transaction that is no Session
// draws no token, WithFencing needs a pool, an attempt must return a
// transaction or an error, and a transaction that comes with an error is
// ended all the same.
func TestDriverContractEdges(t *testing.T) {
	ctx := context.Background()
	keys := []txlock.Key{txlock.Int64Key(1)}

	d := &fakeDriver{}
	var tokenErr error
	d.results = []driver.Result{{Rows: 1, Tx: &fakeTx{d: d, name: "granted", fn: func(ctx context.Context) error {
		_, tokenErr = txlock.FenceToken(ctx)
		return nil
	}}}}
	_, err := txlock.DriverLock(ctx, d, keys, true)
	require.NoError(t, err)
	assert.ErrorIs(t, tokenErr, txlock.ErrNoToken, "a Tx that is no driver.Session")
	assert.ErrorContains(t, tokenErr, "driver.Session")

	_, err = txlock.DriverLock(ctx, &fakeDriver{}, keys, true, txlock.WithFencing())
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument, "WithFencing on a driver that is no Drawer")
	_, err = txlock.DriverLock(ctx, &fakeDrawer{}, keys, true, txlock.WithFencing())
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument, "WithFencing on one session")
	assert.ErrorContains(t, err, "one session")

	d = &fakeDriver{results: []driver.Result{{}}}
	_, err = txlock.DriverLock(ctx, d, keys, true)
	assert.ErrorContains(t, err, "neither a transaction nor an error")

	d = &fakeDriver{}
	boom := errors.New("fake: statement failed")
	d.results = []driver.Result{{Err: boom, Tx: d.tx("stray")}}
	_, err = txlock.DriverLock(ctx, d, keys, true)
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, []string{"stray rollback", "stray close"}, d.log)

	d = &fakeDriver{}
	d.results = []driver.Result{{Rows: 1, Tx: &fakeTx{d: d, name: "failed", commitErr: fmt.Errorf("%w: fake", driver.ErrCommitRolledBack)}}}
	_, err = txlock.DriverLock(ctx, d, keys, true)
	assert.ErrorIs(t, err, txlock.ErrCommitFailed)
	assert.ErrorContains(t, err, "COMMIT rolled it back")
}

// WithRetry(DefaultRetry) is no WithRetry: WithServerWait takes it.
func TestDefaultRetryIsNoOption(t *testing.T) {
	d := &fakeDriver{}
	d.results = []driver.Result{{Tx: d.tx("granted"), Rows: 1}}
	_, err := txlock.DriverLock(context.Background(), d, []txlock.Key{txlock.Int64Key(1)}, false,
		txlock.WithRetry(txlock.DefaultRetry), txlock.WithServerWait(txlock.ServerWait{}))
	require.NoError(t, err)
	require.Len(t, d.sent, 1)
	assert.Positive(t, d.sent[0].Window, "the attempt was a ServerWait window")
	_, err = txlock.DriverLock(context.Background(), &fakeDriver{}, []txlock.Key{txlock.Int64Key(1)}, false,
		txlock.WithRetry(txlock.ExponentialBackoff{}), txlock.WithServerWait(txlock.ServerWait{}))
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
}

// A fn that ended the transaction itself (it may have committed) and
// returned nil after its context ended gets both facts: the context's end,
// and ErrFnEndedTx; never a plain "rolled back".
func TestDriverFnEndedTxAfterItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := &fakeDriver{}
	d.results = []driver.Result{{Rows: 1, Tx: &fakeTx{d: d, name: "granted", rollbackErr: driver.ErrFnEndedTx, fn: func(context.Context) error {
		cancel() // the caller's context ends while fn runs
		return nil
	}}}}
	_, err := txlock.DriverLock(ctx, d, []txlock.Key{txlock.Int64Key(1)}, true)
	assert.ErrorIs(t, err, context.Canceled)
	assert.ErrorIs(t, err, txlock.ErrFnEndedTx)
	assert.NotContains(t, err.Error(), "rolled back")
	assert.Equal(t, []string{"granted fn", "granted rollback", "granted close"}, d.log)
}

// slowDriver answers its attempt with a grant, but only after the
// attempt's deadline has passed.
type slowDriver struct{ fakeDriver }

func (d *slowDriver) Attempt(ctx context.Context, a driver.Request) (driver.Result, error) {
	time.Sleep(time.Until(a.Deadline) + 50*time.Millisecond)
	return d.fakeDriver.Attempt(ctx, a)
}

// A term's attempt is bounded by its TTL on a driver too: a grant that
// comes after the bound is rolled back, and the campaign fails with an
// error that says the attempt did not return in time.
func TestDriverTermAttemptBound(t *testing.T) {
	d := &slowDriver{}
	d.results = []driver.Result{{Tx: d.tx("late"), Rows: 1}}
	ttl := 300 * time.Millisecond
	term, err := txlock.DriverTerm(context.Background(), d, txlock.Int64Key(1), false, nil,
		txlock.WithHeartbeat(txlock.Heartbeat{Interval: ttl / 3, TTL: ttl}))
	assert.Nil(t, term)
	require.Error(t, err)
	assert.ErrorContains(t, err, "did not return within 300ms")
	assert.Equal(t, []string{"late rollback", "late close"}, d.log)
	require.Len(t, d.sent, 1)
	assert.Equal(t, "BEGIN ISOLATION LEVEL READ COMMITTED READ ONLY; "+d.sent[0].Stmt, d.sent[0].Query)
}
