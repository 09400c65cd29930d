package pgxlock

import (
	"context"
	"reflect"

	"github.com/jackc/pgx/v5"

	"github.com/txlock/txlock/driver"
)

// RowQuerier is what a fenced write needs of pgx: pgx.Tx, *pgxpool.Pool,
// *pgxpool.Conn and *pgx.Conn all have it.
type RowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// QuerierOf adapts q for txlock's fenced writes:
//
//	n, err := ft.On(pgxlock.QuerierOf(tx)).Update(ctx, token, set, where)
//
// A fenced write's statement takes arguments, so it runs in q's exec mode,
// which behind PgBouncer must be one that the application's own queries
// can use (see the package documentation). The registry's statements take
// none, and go with the simple protocol in every mode. A nil q gives a nil
// Querier, which the writes refuse with txlock.ErrInvalidArgument.
func QuerierOf(q RowQuerier) driver.Querier {
	if q == nil {
		return nil
	}
	if v := reflect.ValueOf(q); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil
	}
	return querier{q}
}

type querier struct{ q RowQuerier }

func (q querier) QueryRow(ctx context.Context, query string, args []any, dest ...any) error {
	if len(args) == 0 {
		// A statement without arguments (the registry's) goes with the
		// simple protocol, as pgx's Exec sends one: no statement is
		// prepared, which works in every exec mode behind PgBouncer.
		args = []any{pgx.QueryExecModeSimpleProtocol}
	}
	return q.q.QueryRow(ctx, query, args...).Scan(dest...)
}
