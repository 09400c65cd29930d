package locktest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/pgtest"
)

// LockExec is WithLock of a driver on url: fn runs stmt.
type LockExec func(ctx context.Context, url string, key txlock.Key, stmt string, opts ...txlock.Option) error

// CommitWithoutStandby runs lock on a primary whose synchronous standby is
// gone, so that every COMMIT waits for it. When the hold bound, or the
// caller's deadline, ends that wait, the server has committed (it cancels
// the wait with a WARNING, the transaction committed locally), and no
// standby has the commit: the call must report an outcome unknown
// (ErrCommitFailed), never a rollback.
func CommitWithoutStandby(t *testing.T, lock LockExec) {
	primary := pgtest.NewCluster(t, pgtest.ClusterOptions{})
	standby := pgtest.NewSyncStandby(t, primary)
	db := Open(t, primary.URL(), 4)
	table := fmt.Sprintf("cut_%d", time.Now().UnixNano())
	_, err := db.Exec(`CREATE TABLE ` + table + ` (v int)`)
	require.NoError(t, err)
	require.NoError(t, standby.Close())

	for _, tc := range []struct {
		name string
		ctx  time.Duration // the caller's deadline, if not 0
		opts []txlock.Option
	}{
		{name: "WithMaxHold", opts: []txlock.Option{txlock.WithMaxHold(time.Second)}},
		{name: "deadline", ctx: time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if tc.ctx > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctx)
				defer cancel()
			}
			v := len(tc.name)
			start := time.Now()
			err := lock(ctx, primary.URL(), txlock.StringKey(table+tc.name), fmt.Sprintf(`INSERT INTO %s VALUES (%d)`, table, v), tc.opts...)
			took := time.Since(start)
			require.Error(t, err)
			t.Log(err)
			assert.ErrorIs(t, err, txlock.ErrCommitFailed)
			assert.Contains(t, err.Error(), "may or may not have taken effect")
			assert.NotContains(t, err.Error(), "rolled back", "the server committed")
			if tc.opts != nil {
				assert.ErrorIs(t, err, txlock.ErrHoldTimeout)
			} else {
				assert.ErrorIs(t, err, context.DeadlineExceeded)
			}
			assert.Less(t, took, 30*time.Second, "the bound ends the wait")
			// The cancel request reaches the server a little after the call
			// returns.
			assert.Eventually(t, func() bool {
				var n int
				err := db.QueryRow(`SELECT count(*) FROM `+table+` WHERE v = $1`, v).Scan(&n)
				return err == nil && n == 1
			}, 30*time.Second, 20*time.Millisecond, "the row is committed on the primary, though no standby has it")
		})
	}
}
