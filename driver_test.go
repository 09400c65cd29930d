package txlock_test

import (
	"context"
	"errors"
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
	sent    []driver.Attempt
	log     []string
}

func (d *fakeDriver) Attempt(_ context.Context, a driver.Attempt) (driver.Result, error) {
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
	d    *fakeDriver
	name string
}

func (t *fakeTx) Fn(context.Context) error { t.d.log = append(t.d.log, t.name+" fn"); return nil }
func (t *fakeTx) Commit(context.Context) error {
	t.d.log = append(t.d.log, t.name+" commit")
	return nil
}
func (t *fakeTx) Rollback() error { t.d.log = append(t.d.log, t.name+" rollback"); return nil }
func (t *fakeTx) Close()          { t.d.log = append(t.d.log, t.name+" close") }

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
		assert.Empty(t, a.Query, "a window sends Begin, then Stmt")
	}

	d = &fakeDriver{}
	d.results = []driver.Result{{Tx: d.tx("standby"), Rows: 2}}
	_, err = txlock.DriverLock(ctx, d, []txlock.Key{key}, false, wait)
	assert.ErrorIs(t, err, txlock.ErrStandby)
	assert.Equal(t, []string{"standby rollback", "standby close"}, d.log)

	// A polling query that succeeds is a grant, whatever its rows; one
	// that fails with an error that is neither busy nor standby fails
	// the call, with nothing left to end.
	d = &fakeDriver{}
	d.results = []driver.Result{{Tx: d.tx("polled")}}
	ok, err = txlock.DriverLock(ctx, d, []txlock.Key{key}, true)
	require.NoError(t, err)
	assert.True(t, ok)
	assert.Equal(t, []string{"polled fn", "polled commit", "polled close"}, d.log)
	assert.Contains(t, d.sent[0].Query, "; BEGIN")

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
