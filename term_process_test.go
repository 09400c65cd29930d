package txlock_test

import (
	"context"
	"database/sql"
	"os"
	"testing"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/internal/locktest"
	"github.com/txlock/txlock/internal/pgtest"
)

// Terms across processes, with database/sql's terms (locktest.TermChild):
// pgxlock runs the same tests with its own.

func init() {
	if mode := os.Getenv(locktest.TermChildEnv); mode != "" {
		os.Exit(locktest.TermChild(mode, func(url string) (locktest.TermDriver, error) {
			db, err := sql.Open("pgx", url)
			if err != nil {
				return locktest.TermDriver{}, err
			}
			db.SetMaxOpenConns(4)
			return locktest.TermDriver{
				Lead: func(ctx context.Context, key txlock.Key, fn func(context.Context, *txlock.Term) error, opts ...txlock.TermOption) error {
					return txlock.Lead(ctx, db, key, fn, opts...)
				},
				Update: func(ctx context.Context, ft txlock.FencedTable, token int64, set, where []txlock.Col) (int64, error) {
					return ft.Update(ctx, db, token, set, where)
				},
				Close: func() { db.Close() },
			}, nil
		}))
	}
}

// childURL is the URL a candidate process connects to: the test
// PostgreSQL, or with via "PgBouncer" the test PgBouncer, in an exec mode
// that prepares nothing.
func childURL(t *testing.T, via string) string {
	t.Helper()
	if via != "PgBouncer" {
		return pgtest.Postgres(t)
	}
	url, _ := pgtest.PgBouncer(t)
	return url + "&default_query_exec_mode=exec"
}

// See locktest.TermsAcrossProcesses.
func TestTermExclusionAcrossProcesses(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) { locktest.TermsAcrossProcesses(t, termDB(t), childURL(t, via)) })
	}
}

// See locktest.StoppedLeader.
func TestTermStoppedLeader(t *testing.T) {
	for _, via := range []string{"direct", "PgBouncer"} {
		t.Run(via, func(t *testing.T) { locktest.StoppedLeader(t, termDB(t), childURL(t, via)) })
	}
}
