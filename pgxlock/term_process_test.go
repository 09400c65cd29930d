package pgxlock_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
	"github.com/txlock/txlock/pgxlock"
)

// Terms across processes, as the database/sql suite runs them
// (locktest.TermChild), with pgxlock's terms and fenced writes in the
// candidate processes, directly and through PgBouncer (in exec mode, which
// the fenced writes' and the records' parameterized statements need
// there).

func init() {
	if mode := os.Getenv(locktest.TermChildEnv); mode != "" {
		os.Exit(locktest.TermChild(mode, func(url string) (locktest.TermDriver, error) {
			cfg, err := pgxpool.ParseConfig(url)
			if err != nil {
				return locktest.TermDriver{}, err
			}
			cfg.MaxConns = 4
			pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
			if err != nil {
				return locktest.TermDriver{}, err
			}
			return locktest.TermDriver{
				Lead: func(ctx context.Context, key txlock.Key, fn func(context.Context, *txlock.Term) error, opts ...txlock.TermOption) error {
					return pgxlock.Lead(ctx, pool, key, fn, opts...)
				},
				Update: func(ctx context.Context, ft txlock.FencedTable, token int64, set, where []txlock.Col) (int64, error) {
					return ft.On(pgxlock.QuerierOf(pool)).Update(ctx, token, set, where)
				},
				Close: pool.Close,
			}, nil
		}))
	}
}

// processURL is the URL of the candidate processes: the test PostgreSQL,
// or with via "PgBouncer" the test PgBouncer, in exec mode.
func processURL(t *testing.T, via string) string {
	if via != "PgBouncer" {
		return pgtest.Postgres(t)
	}
	return bouncerURL(t) + "&default_query_exec_mode=exec"
}

// See locktest.TermsAcrossProcesses.
func TestTermExclusionAcrossProcesses(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			_, admin := direct(t)
			require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
			locktest.TermsAcrossProcesses(t, admin, processURL(t, via))
		})
	}
}

// See locktest.StoppedLeader.
func TestTermStoppedLeader(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) {
			_, admin := direct(t)
			require.NoError(t, txlock.Fencer{}.CreateSequence(context.Background(), admin))
			locktest.StoppedLeader(t, admin, processURL(t, via))
		})
	}
}
