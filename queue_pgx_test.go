package txlock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// pgxlock's callers on one pool queue in this package's local queues: the
// lock passes between them in FIFO order, and only the queue's head polls.
// (The test lives here, where QueueRefs shows each caller queue.)
func TestPgxLocalQueue(t *testing.T) {
	admin := direct(t)
	pool, err := pgxpool.New(context.Background(), pgtest.Postgres(t))
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	key := txlock.StringKey(uniq(t))
	release := hold(t, admin, key, false)
	refs := txlock.QueueRefs()
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Go(func() {
			assert.NoError(t, pgxlock.WithLock(context.Background(), pool, key, func(context.Context, pgx.Tx) error {
				mu.Lock()
				order = append(order, i)
				mu.Unlock()
				return nil
			}, txlock.WithTimeout(30*time.Second)))
		})
		// Each caller is in the queue before the next one comes.
		require.Eventually(t, func() bool { return txlock.QueueRefs() == refs+i+1 }, 5*time.Second, time.Millisecond)
	}
	release()
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2, 3, 4}, order)
}
