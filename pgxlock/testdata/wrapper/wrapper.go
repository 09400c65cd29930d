// Package wrapper is a pool wrapper of the kind a tracing library makes:
// TestDBIsClosed builds it to show which uses of pgxlock compile.
package wrapper

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool wraps a *pgxpool.Pool, with a BeginTx of its own.
type Pool struct{ *pgxpool.Pool }

// BeginTx begins a transaction on the wrapped pool.
func (p Pool) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	return p.Pool.BeginTx(ctx, opts)
}

func nop(context.Context, pgx.Tx) error { return nil }
