package pgxlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// WithOwner names the holder in pg_stat_activity while the lock is held,
// and the name ends with the transaction, behind PgBouncer too.
func TestOwner(t *testing.T) {
	label := `pgx export-worker o'neil\x $txlock$ ` + locktest.Uniq(t)[len(t.Name())+1:]
	bouncerURL, _ := pgtest.PgBouncer(t)
	for _, tc := range []struct{ name, url string }{
		{"direct", pgtest.Postgres(t)},
		{"pgbouncer", bouncerURL},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			_, admin := direct(t)
			pool := newPool(t, tc.url+"&application_name=client-a", "", 2)
			key := txlock.StringKey(uniq(t))
			appName := func(q interface {
				QueryRow(context.Context, string, ...any) pgx.Row
			}) (name string) {
				require.NoError(t, q.QueryRow(ctx, `SELECT pg_catalog.current_setting('application_name')`).Scan(&name))
				return name
			}
			var pid int
			err := pgxlock.WithLock(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) error {
				if err := tx.QueryRow(ctx, `SELECT pg_catalog.pg_backend_pid()`).Scan(&pid); err != nil {
					return err
				}
				var name string
				if err := admin.QueryRowContext(ctx, `SELECT application_name FROM pg_catalog.pg_stat_activity WHERE pid = $1`, pid).Scan(&name); err != nil {
					return err
				}
				assert.Equal(t, label, name, "pg_stat_activity while the lock is held")
				assert.Equal(t, label, appName(tx))
				return nil
			}, txlock.WithOwner(label))
			require.NoError(t, err)
			assert.Equal(t, "client-a", appName(pool), "the session after the commit")
			if tc.name == "pgbouncer" {
				// Another client, whose queries PgBouncer sends to the
				// holder's server connection sooner or later, sees its own
				// name there.
				other := newPool(t, tc.url+"&application_name=client-b", "exec", 1)
				found := false
				for i := 0; i < 200 && !found; i++ {
					var name string
					var p int
					require.NoError(t, other.QueryRow(ctx, `SELECT pg_catalog.current_setting('application_name'), pg_catalog.pg_backend_pid()`).Scan(&name, &p))
					if p == pid {
						found = true
						assert.Equal(t, "client-b", name, "the next client of the holder's server connection")
					}
				}
				require.True(t, found, "client-b never reached server connection %d", pid)
			}
		})
	}
}

// A term's label shows for as long as the term lasts, and goes with its
// release, directly and through PgBouncer.
func TestOwnerTerm(t *testing.T) {
	label := "pgx leader " + locktest.Uniq(t)[len(t.Name())+1:]
	for _, via := range []struct{ name, url, mode string }{
		{"direct", pgtest.Postgres(t), ""},
		{"PgBouncer", bouncerURL(t), "cache_statement"},
	} {
		t.Run(via.name, func(t *testing.T) {
			ctx := context.Background()
			pool, admin := termPool(t, via.url, via.mode)
			labelled := func() (n int) {
				require.NoError(t, admin.QueryRow(`SELECT pg_catalog.count(*) FROM pg_catalog.pg_stat_activity WHERE application_name = $1`, label).Scan(&n))
				return n
			}
			term, err := pgxlock.AcquireTerm(ctx, pool, txlock.StringKey(uniq(t)), txlock.WithHeartbeat(fastBeat), txlock.WithOwner(label))
			require.NoError(t, err)
			assert.Equal(t, 1, labelled(), "the term's session carries the label")
			require.NoError(t, term.Release(ctx))
			require.Eventually(t, func() bool { return labelled() == 0 }, 5*time.Second, 10*time.Millisecond, "the label goes with the term")
		})
	}
}
