package txlock

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock/driver"
)

// answers is an attempter whose attempts answer as its script says, each
// with a transaction of its own.
type answers struct {
	script []func(ctx context.Context, r driver.Request) (driver.Result, error)
	txs    []*countingTx
}

func (a *answers) Attempt(ctx context.Context, r driver.Request) (driver.Result, error) {
	next := a.script[0]
	if len(a.script) > 1 {
		a.script = a.script[1:]
	}
	res, err := next(ctx, r)
	if res.Tx != nil {
		a.txs = append(a.txs, res.Tx.(*countingTx))
	}
	return res, err
}

// countingTx counts how its transaction was ended.
type countingTx struct{ rollbacks, closes atomic.Int32 }

func (t *countingTx) Fn(context.Context) error     { return nil }
func (t *countingTx) Commit(context.Context) error { return nil }
func (t *countingTx) Rollback() error              { t.rollbacks.Add(1); return nil }
func (t *countingTx) Close()                       { t.closes.Add(1) }

func rows(n int64) func(context.Context, driver.Request) (driver.Result, error) {
	return func(context.Context, driver.Request) (driver.Result, error) {
		return driver.Result{Tx: &countingTx{}, Rows: n}, nil
	}
}

// settle decides what an answer means, once for every attempter: a busy
// answer's transaction is ended, a grant's becomes the round's holder, and
// a grant that came as ctx ended, or after the attempt's own bound, is
// ended and fails.
func TestSettle(t *testing.T) {
	ctx := context.Background()
	t.Run("busy, then granted", func(t *testing.T) {
		c := testConfig(t, nil, WithRetry(ConstantBackoff{Interval: time.Millisecond}))
		a := &answers{script: []func(context.Context, driver.Request) (driver.Result, error){rows(0), rows(0), rows(1)}}
		st := &lockState{lock: Lock{Keys: testKeys}}
		ok, err := lockLoop(ctx, c, c.waitMode(false), &plan{c: c, a: a, keys: testKeys}, nil, nil, st)
		require.NoError(t, err)
		require.True(t, ok)
		require.Len(t, a.txs, 3)
		for i, tx := range a.txs[:2] {
			assert.Equal(t, int32(1), tx.rollbacks.Load(), "busy attempt %d's transaction is rolled back", i)
			assert.Equal(t, int32(1), tx.closes.Load(), "and closed")
		}
		assert.Same(t, a.txs[2], st.held.tx, "the grant's transaction is the round's holder")
		assert.Zero(t, a.txs[2].rollbacks.Load())
		assert.Equal(t, 3, st.lock.Attempts)
	})
	t.Run("granted as ctx ended", func(t *testing.T) {
		c := testConfig(t, nil)
		cctx, cancel := context.WithCancel(ctx)
		a := &answers{script: []func(context.Context, driver.Request) (driver.Result, error){func(context.Context, driver.Request) (driver.Result, error) {
			cancel()
			return driver.Result{Tx: &countingTx{}, Rows: 1}, nil
		}}}
		st := &lockState{lock: Lock{Keys: testKeys}}
		ok, err := lockLoop(cctx, c, c.waitMode(false), &plan{c: c, a: a, keys: testKeys}, nil, nil, st)
		assert.False(t, ok)
		assert.ErrorIs(t, err, context.Canceled)
		require.Len(t, a.txs, 1)
		assert.Equal(t, int32(1), a.txs[0].rollbacks.Load(), "the void grant is rolled back")
		assert.Nil(t, st.held.tx)
	})
	t.Run("granted after the attempt's bound", func(t *testing.T) {
		c := testConfig(t, nil, WithTimeout(time.Minute))
		var bounded bool
		a := &answers{script: []func(context.Context, driver.Request) (driver.Result, error){func(_ context.Context, r driver.Request) (driver.Result, error) {
			_, bounded = r.WaitCtx.Deadline()
			<-r.WaitCtx.Done() // the answer comes after the bound
			return driver.Result{Tx: &countingTx{}, Rows: 1}, nil
		}}}
		st := &lockState{lock: Lock{Keys: testKeys}}
		ok, err := lockLoop(ctx, c, c.waitMode(false), &plan{c: c, a: a, keys: testKeys, bound: 20 * time.Millisecond}, nil, nil, st)
		assert.False(t, ok)
		assert.True(t, bounded, "the request's context carries the bound")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "the attempt did not return within 20ms")
		assert.Equal(t, int32(1), a.txs[0].rollbacks.Load())
	})
	t.Run("busy after the attempt's bound", func(t *testing.T) {
		c := testConfig(t, nil, WithTimeout(time.Second), WithRetry(ConstantBackoff{Interval: time.Millisecond}))
		a := &answers{script: []func(context.Context, driver.Request) (driver.Result, error){func(_ context.Context, r driver.Request) (driver.Result, error) {
			<-r.WaitCtx.Done()
			return driver.Result{Tx: &countingTx{}}, nil
		}}}
		st := &lockState{lock: Lock{Keys: testKeys}}
		ok, err := lockLoop(ctx, c, c.waitMode(false), &plan{c: c, a: a, keys: testKeys, bound: 20 * time.Millisecond}, nil, nil, st)
		assert.False(t, ok)
		assert.ErrorIs(t, err, ErrLockTimeout, "a busy answer stands, however late: the wait goes on to its deadline")
		assert.Greater(t, st.lock.Attempts, 1)
	})
	t.Run("neither a transaction nor an error", func(t *testing.T) {
		c := testConfig(t, nil)
		a := &answers{script: []func(context.Context, driver.Request) (driver.Result, error){func(context.Context, driver.Request) (driver.Result, error) {
			return driver.Result{Rows: 1}, nil
		}}}
		st := &lockState{lock: Lock{Keys: testKeys}}
		_, err := lockLoop(ctx, c, c.waitMode(false), &plan{c: c, a: a, keys: testKeys}, nil, nil, st)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "neither a transaction nor an error")
		assert.False(t, errors.Is(err, ErrLockTimeout))
	})
}
