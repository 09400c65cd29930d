package txlock_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// randomHex returns 16 random hex digits, which make a test's label its
// own on a server that other tests share.
func randomHex(t *testing.T) string {
	var b [8]byte
	_, err := rand.Read(b[:])
	require.NoError(t, err)
	return hex.EncodeToString(b[:])
}

// withApp returns u with its application_name set to name.
func withApp(t *testing.T, u, name string) string {
	return locktest.WithParam(t, u, "application_name", name)
}

// sessionApp returns the application_name and the backend pid of a
// statement of db's.
func sessionApp(t *testing.T, db *sql.DB) (name string, pid int) {
	require.NoError(t, db.QueryRow(`SELECT pg_catalog.current_setting('application_name'), pg_catalog.pg_backend_pid()`).Scan(&name, &pid))
	return name, pid
}

// WithOwner names the holder in pg_stat_activity while the lock is held, and
// only then: a waiter keeps its session's name, and the name ends with the
// transaction, behind PgBouncer too, where the next client of the server
// connection sees its own name.
func TestOwner(t *testing.T) {
	// Quotes, a backslash and the DO block's own dollar quote must reach
	// the server as they are, in every statement form.
	label := `export-worker o'neil\x $txlock$ ` + randomHex(t)
	bouncerURL, _ := pgtest.PgBouncer(t)
	for _, tc := range []struct{ name, url string }{
		{"direct", pgtest.Postgres(t)},
		{"pgbouncer", bouncerURL + "&default_query_exec_mode=exec"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			admin := direct(t)
			a := open(t, withApp(t, tc.url, "client-a"))
			b := open(t, withApp(t, tc.url, "client-b"))
			key := txlock.StringKey(uniq(t))

			var pid int
			err := txlock.WithLock(ctx, a, key, func(ctx context.Context, tx *sql.Tx) error {
				if err := tx.QueryRowContext(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				var name string
				if err := admin.QueryRowContext(ctx, `SELECT application_name FROM pg_catalog.pg_stat_activity WHERE pid = $1`, pid).Scan(&name); err != nil {
					return err
				}
				assert.Equal(t, label, name, "pg_stat_activity while the lock is held")
				return nil
			}, txlock.WithOwner(label))
			require.NoError(t, err)

			name, _ := sessionApp(t, a)
			assert.Equal(t, "client-a", name, "the holder's session after the commit")
			if tc.name == "pgbouncer" {
				found := false
				for i := 0; i < 200 && !found; i++ {
					name, p := sessionApp(t, b)
					if p == pid {
						found = true
						assert.Equal(t, "client-b", name, "the next client of the holder's server connection")
					}
				}
				require.True(t, found, "client-b never reached server connection %d", pid)
			}

			// A waiter, in the server's lock queue, keeps its own name.
			release := hold(t, admin, key, false)
			done := make(chan error, 1)
			go func() {
				done <- txlock.WithLock(ctx, a, key, func(ctx context.Context, tx *sql.Tx) error {
					var name string
					if err := tx.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('application_name')`).Scan(&name); err != nil {
						return err
					}
					if name != label {
						return fmt.Errorf("granted by a window in the server, the transaction's name is %q, want %q", name, label)
					}
					return nil
				},
					txlock.WithOwner(label), txlock.WithServerWait(txlock.ServerWait{Window: 5 * time.Second}), txlock.WithTimeout(10*time.Second))
			}()
			require.Eventually(t, func() bool {
				var n int
				require.NoError(t, admin.QueryRow(`SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE wait_event = 'advisory' AND application_name = 'client-a'`).Scan(&n))
				return n == 1
			}, 5*time.Second, 5*time.Millisecond, "the waiter waits in the server under its session's name")
			var n int
			require.NoError(t, admin.QueryRow(`SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE application_name = $1`, label).Scan(&n))
			assert.Zero(t, n, "no session carries the label before the grant")
			release()
			require.NoError(t, <-done)
		})
	}
}

// A label that the server would truncate or rewrite is refused, naming the
// problem, before the database is touched.
func TestOwnerBadInput(t *testing.T) {
	db := direct(t)
	fn := func(context.Context, *sql.Tx) error { t.Error("fn ran"); return nil }
	for label, want := range map[string]string{
		"":                       "the label is empty",
		string(make([]byte, 64)): "64 bytes",
		"caf\u00e9":              "not printable ASCII",
		"tab\there":              "not printable ASCII",
	} {
		err := txlock.WithLock(context.Background(), db, txlock.StringKey(uniq(t)), fn, txlock.WithOwner(label))
		assert.ErrorIs(t, err, txlock.ErrInvalidArgument, "%q", label)
		assert.ErrorContains(t, err, want, "%q", label)
	}
	_, err := txlock.AcquireTerm(context.Background(), db, txlock.StringKey(uniq(t)), txlock.WithOwner("tab\there"))
	assert.ErrorIs(t, err, txlock.ErrInvalidArgument)
	assert.ErrorContains(t, err, "not printable ASCII")
}

// A term's label shows for as long as the term lasts, heartbeats
// included, and goes with its release, directly and through PgBouncer.
func TestOwnerTerm(t *testing.T) {
	label := "leader " + randomHex(t)
	for _, via := range termVias {
		t.Run(via.name, func(t *testing.T) {
			ctx := context.Background()
			db := via.db(t)
			admin := termDB(t)
			labelled := func() (n int) {
				require.NoError(t, admin.QueryRow(`SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE application_name = $1`, label).Scan(&n))
				return n
			}
			term, err := txlock.AcquireTerm(ctx, db, txlock.StringKey(uniq(t)), txlock.WithHeartbeat(fastBeat), txlock.WithOwner(label))
			require.NoError(t, err)
			assert.Equal(t, 1, labelled(), "the term's session carries the label")
			time.Sleep(3 * fastBeat.Interval)
			require.NoError(t, term.Err())
			assert.Equal(t, 1, labelled(), "after heartbeats")
			require.NoError(t, term.Release(ctx))
			require.Eventually(t, func() bool { return labelled() == 0 }, 5*time.Second, 10*time.Millisecond, "the label goes with the term")
		})
	}
}

// In a caller's transaction (LockTx), the label lasts until that
// transaction ends.
func TestOwnerLockTx(t *testing.T) {
	ctx := context.Background()
	db := open(t, withApp(t, pgtest.Postgres(t), "client-a"))
	direct(t) // the no-advisory-lock check
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, nil)
	require.NoError(t, err)
	require.NoError(t, txlock.LockTx(ctx, tx, txlock.StringKey(uniq(t)), txlock.WithOwner("repo-method")))
	var name string
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('application_name')`).Scan(&name))
	assert.Equal(t, "repo-method", name)
	require.NoError(t, tx.Commit())
	require.NoError(t, conn.QueryRowContext(ctx, `SELECT pg_catalog.current_setting('application_name')`).Scan(&name))
	assert.Equal(t, "client-a", name)
}
