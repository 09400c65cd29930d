//go:build !wrapper_as_db

package wrapper

import (
	"context"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/pgxlock"
)

// Lock locks on the pool p wraps.
func Lock(ctx context.Context, p Pool) error {
	return pgxlock.WithLock(ctx, p.Pool, txlock.StringKey("k"), nop)
}
