package locktest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
)

// StoppedRetry sets up a serialization retry that cannot take its lock.
// On its first run, fn reads a row, has admin update that row and commit,
// then updates it too, which the server refuses with a real 40001 ("could
// not serialize access due to concurrent update"). Before fn returns, a
// transaction of admin asks for fn's key with the blocking
// pg_advisory_xact_lock, and fn waits until the server shows it waiting
// or holding: the server grants it the key when fn's transaction ends (at
// the failed statement, which aborts it and releases its locks, or at the
// rollback at the latest), so the retry finds the key busy, whatever the
// timing. It keeps the key until the test ends.
type StoppedRetry struct {
	t      *testing.T
	admin  *sql.DB
	Key    txlock.Key // the call's key
	table  string
	runs   atomic.Int32
	hold   *sql.Tx    // the transaction that takes key during fn's first run
	pid    int        // its backend
	held   chan error // its lock statement's result, once granted
	queued atomic.Bool
}

// NewStoppedRetry creates the row fn works on, in a table it drops when the
// test ends, and the transaction of admin that will take the key.
func NewStoppedRetry(t *testing.T, admin *sql.DB) *StoppedRetry {
	ctx := context.Background()
	s := &StoppedRetry{t: t, admin: admin, Key: txlock.StringKey(Uniq(t)),
		table: fmt.Sprintf("stopped_retry_%d", time.Now().UnixNano()), held: make(chan error, 1)}
	_, err := admin.ExecContext(ctx, `CREATE TABLE `+s.table+` (id int PRIMARY KEY, n int NOT NULL);
		INSERT INTO `+s.table+` VALUES (1, 0)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := admin.ExecContext(ctx, `DROP TABLE `+s.table)
		assert.NoError(t, err)
	})
	s.hold, err = admin.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, s.hold.QueryRowContext(ctx, `SELECT pg_backend_pid()`).Scan(&s.pid))
	t.Cleanup(func() {
		if s.queued.Load() {
			select {
			case err := <-s.held:
				assert.NoError(t, err, "the holder's lock statement")
			case <-time.After(time.Minute):
				t.Error("the holder was never granted the key")
			}
		}
		assert.NoError(t, s.hold.Rollback())
	})
	return s
}

// Fn is the call's fn: see stoppedRetry. A later run returns nil, which
// the checks catch.
func (s *StoppedRetry) Fn(ctx context.Context, tx Tx) error {
	if s.runs.Add(1) > 1 {
		return nil
	}
	n, err := tx.QueryInt(ctx, `SELECT n FROM `+s.table+` WHERE id = 1`)
	if err != nil {
		return err
	}
	if _, err := s.admin.ExecContext(ctx, `UPDATE `+s.table+` SET n = n + 100 WHERE id = 1`); err != nil {
		return err
	}
	// No parameters: the statement runs the same in every exec mode.
	err = tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET n = %d WHERE id = 1`, s.table, n+1))
	s.queueHolder()
	return err
}

// queueHolder starts the holder's lock statement, and returns once the
// server shows it waiting for the key or holding it.
func (s *StoppedRetry) queueHolder() {
	s.queued.Store(true)
	go func() {
		_, err := s.hold.ExecContext(context.Background(), `SELECT pg_advisory_xact_lock(`+LockArgs(s.Key)+`)`)
		s.held <- err
	}()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		var in bool
		err := s.admin.QueryRow(`SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND locktype = 'advisory')`, s.pid).Scan(&in)
		switch {
		case err != nil:
			s.t.Errorf("looking for the holder's lock: %v", err)
			return
		case in:
			return
		case time.Now().After(deadline):
			s.t.Error("the holder never asked for the key")
			return
		}
	}
}

// Check asserts that err is fn's 40001, that fn was not run again, and
// that the holder has the key.
func (s *StoppedRetry) Check(err error) {
	t := s.t
	t.Helper()
	t.Logf("the call's error: %v", err)
	var pgErr *pgconn.PgError
	if assert.True(t, errors.As(err, &pgErr), "fn's error is reachable: %v", err) {
		assert.Equal(t, "40001", pgErr.Code, "%v", err)
	}
	assert.ErrorContains(t, err, "fn was not run again after its serialization failure")
	assert.Equal(t, int32(1), s.runs.Load(), "fn ran once")
	assert.Equal(t, 1, HeldBy(t, s.admin, s.Key), "the holder has the key")
}
