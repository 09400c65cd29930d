package locktest

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/txlock/txlock"
)

// Fleet runs callers goroutines for each of pools pools for run: each
// calls call(pool) in a loop, and stops at the first error. It fails t on
// every error (a timeout as a call that starved) and on a pool that
// acquired nothing, and returns each pool's count of calls that
// succeeded. The fleets of the no-starvation tests use it, on database/sql
// and on pgx.
func Fleet(t testing.TB, pools, callers int, run time.Duration, call func(pool int) error) []int64 {
	t.Helper()
	var (
		wg       sync.WaitGroup
		acquired = make([]atomic.Int64, pools)
		stop     atomic.Bool
		failures = make(chan error, pools*callers)
	)
	for p := range pools {
		for range callers {
			wg.Go(func() {
				for !stop.Load() {
					if err := call(p); err != nil {
						failures <- err
						return
					}
					acquired[p].Add(1)
				}
			})
		}
	}
	time.Sleep(run)
	stop.Store(true)
	wg.Wait()
	close(failures)
	for err := range failures {
		assert.False(t, errors.Is(err, txlock.ErrLockTimeout), "a call starved: %v", err)
		assert.NoError(t, err)
	}
	counts := make([]int64, pools)
	for p := range counts {
		counts[p] = acquired[p].Load()
		assert.Positive(t, counts[p], "pool %d acquired nothing", p)
	}
	t.Logf("acquisitions per pool in %v: %v", run, counts)
	return counts
}
