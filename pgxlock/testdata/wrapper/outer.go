//go:build wrapper_as_db

package wrapper

import (
	"context"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/pgxlock"
)

// Lock passes the wrapper itself, which pgxlock cannot drive.
func Lock(ctx context.Context, p Pool) error {
	return pgxlock.WithLock(ctx, p, txlock.StringKey("k"), nop)
}
