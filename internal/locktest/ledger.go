package locktest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Ledger is a deliberately racy read-sleep-write workload: each step reads
// a counter, sleeps, writes it back plus one, and records when it entered
// and left. Without mutual exclusion it loses updates and its steps
// overlap. Its tables are Table+"_counter" and Table+"_runs".
type Ledger struct {
	Table string
}

// NewLedger creates a ledger's tables through db, prefixed with prefix,
// and drops them when the test ends.
func NewLedger(t testing.TB, db *sql.DB, prefix string) *Ledger {
	t.Helper()
	l := &Ledger{Table: fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())}
	_, err := db.Exec(`CREATE TABLE ` + l.Table + `_counter (n int NOT NULL);
		INSERT INTO ` + l.Table + `_counter VALUES (0);
		CREATE TABLE ` + l.Table + `_runs (id serial PRIMARY KEY, enter timestamptz NOT NULL, exit timestamptz)`)
	require.NoError(t, err)
	t.Cleanup(func() {
		_, err := db.Exec(`DROP TABLE ` + l.Table + `_counter, ` + l.Table + `_runs`)
		assert.NoError(t, err)
	})
	return l
}

// Tx is what a ledger step runs its statements on: a transaction of
// database/sql (SQLTx) or of a driver's own API.
type Tx interface {
	QueryInt(ctx context.Context, query string, args ...any) (int, error)
	Exec(ctx context.Context, query string, args ...any) error
}

// SQLTx is a *sql.Tx as a ledger's Tx.
type SQLTx struct{ Tx *sql.Tx }

func (t SQLTx) QueryInt(ctx context.Context, query string, args ...any) (int, error) {
	var n int
	err := t.Tx.QueryRowContext(ctx, query, args...).Scan(&n)
	return n, err
}

func (t SQLTx) Exec(ctx context.Context, query string, args ...any) error {
	_, err := t.Tx.ExecContext(ctx, query, args...)
	return err
}

// Step is one run of the workload in tx.
func (l *Ledger) Step(ctx context.Context, tx Tx) error {
	id, err := tx.QueryInt(ctx, `INSERT INTO `+l.Table+`_runs (enter) VALUES (clock_timestamp()) RETURNING id`)
	if err != nil {
		return err
	}
	n, err := tx.QueryInt(ctx, `SELECT n FROM `+l.Table+`_counter`)
	if err != nil {
		return err
	}
	time.Sleep(2 * time.Millisecond)
	if err := tx.Exec(ctx, `UPDATE `+l.Table+`_counter SET n = $1`, n+1); err != nil {
		return err
	}
	return tx.Exec(ctx, `UPDATE `+l.Table+`_runs SET exit = clock_timestamp() WHERE id = $1`, id)
}

// Check returns the counter and the number of overlapping pairs of steps.
func (l *Ledger) Check(t testing.TB, db *sql.DB) (n, overlaps int) {
	t.Helper()
	require.NoError(t, db.QueryRow(`SELECT n FROM `+l.Table+`_counter`).Scan(&n))
	require.NoError(t, db.QueryRow(`SELECT count(*) FROM `+l.Table+`_runs a JOIN `+l.Table+`_runs b
		ON a.id < b.id AND a.enter < b.exit AND b.enter < a.exit`).Scan(&overlaps))
	return n, overlaps
}
