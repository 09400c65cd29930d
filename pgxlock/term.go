package pgxlock

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
)

// AcquireTerm campaigns for the exclusive lock key until it is granted,
// then starts a term and returns it: txlock.AcquireTerm, on pgx. The
// term's transaction, its heartbeats and its rollback run on one
// connection of pool, and its fencing token is drawn on another when the
// term starts (so pool needs a connection to spare then, or
// txlock.WithFencing): a term takes a pool, never a single connection. The
// statements of a term take no arguments, so pgx sends them with the
// simple protocol in every exec mode, behind PgBouncer too.
func AcquireTerm(ctx context.Context, pool *pgxpool.Pool, key txlock.Key, opts ...txlock.TermOption) (*txlock.Term, error) {
	a, err := termAcquirer(pool)
	if err != nil {
		return nil, err
	}
	return txlock.DriverTerm(ctx, a, key, false, nil, opts...)
}

// TryAcquireTerm makes one attempt at key, and starts a term if the lock
// is granted: txlock.TryAcquireTerm. If another session holds the lock, it
// returns a nil Term and a nil error.
func TryAcquireTerm(ctx context.Context, pool *pgxpool.Pool, key txlock.Key, opts ...txlock.TermOption) (*txlock.Term, error) {
	a, err := termAcquirer(pool)
	if err != nil {
		return nil, err
	}
	return txlock.DriverTerm(ctx, a, key, true, nil, opts...)
}

// Lead campaigns for key as AcquireTerm does and, once elected, runs fn
// with the term, then releases it: txlock.Lead.
func Lead(ctx context.Context, pool *pgxpool.Pool, key txlock.Key, fn func(ctx context.Context, t *txlock.Term) error, opts ...txlock.TermOption) error {
	a, err := termAcquirer(pool)
	if err != nil {
		return err
	}
	return txlock.DriverLead(ctx, a, key, fn, nil, opts...)
}

// AcquireTerm is AcquireTerm on the Locker's pool.
func (l *Locker) AcquireTerm(ctx context.Context, key txlock.Key, opts ...txlock.TermOption) (*txlock.Term, error) {
	return txlock.DriverTerm(ctx, &acquirer{pool: l.pool}, key, false, l.opts, opts...)
}

// TryAcquireTerm is TryAcquireTerm on the Locker's pool.
func (l *Locker) TryAcquireTerm(ctx context.Context, key txlock.Key, opts ...txlock.TermOption) (*txlock.Term, error) {
	return txlock.DriverTerm(ctx, &acquirer{pool: l.pool}, key, true, l.opts, opts...)
}

// Lead is Lead on the Locker's pool.
func (l *Locker) Lead(ctx context.Context, key txlock.Key, fn func(ctx context.Context, t *txlock.Term) error, opts ...txlock.TermOption) error {
	return txlock.DriverLead(ctx, &acquirer{pool: l.pool}, key, fn, l.opts, opts...)
}

// termAcquirer returns the acquirer of a term's attempts on pool.
func termAcquirer(pool *pgxpool.Pool) (*acquirer, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil", txlock.ErrInvalidArgument)
	}
	return &acquirer{pool: pool}, nil
}
