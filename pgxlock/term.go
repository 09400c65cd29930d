package pgxlock

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
)

// AcquireTerm campaigns for the exclusive lock key until it is granted,
// then starts a term and returns it: txlock.AcquireTerm, on pgx. The
// term's transaction, its heartbeats and its rollback run on one
// connection of db, which must be a *pgxpool.Pool with a connection to
// spare for the fencing token's draw (or txlock.WithFencing) when the term
// starts. The statements of a term take no arguments, so pgx sends them
// with the simple protocol in every exec mode, behind PgBouncer too.
func AcquireTerm[D DB](ctx context.Context, db D, key txlock.Key, opts ...txlock.TermOption) (*txlock.Term, error) {
	a, err := termAcquirer(db)
	if err != nil {
		return nil, err
	}
	return txlock.DriverTerm(ctx, a, key, false, nil, opts...)
}

// TryAcquireTerm makes one attempt at key, and starts a term if the lock
// is granted: txlock.TryAcquireTerm. If another session holds the lock, it
// returns a nil Term and a nil error.
func TryAcquireTerm[D DB](ctx context.Context, db D, key txlock.Key, opts ...txlock.TermOption) (*txlock.Term, error) {
	a, err := termAcquirer(db)
	if err != nil {
		return nil, err
	}
	return txlock.DriverTerm(ctx, a, key, true, nil, opts...)
}

// Lead campaigns for key as AcquireTerm does and, once elected, runs fn
// with the term, then releases it: txlock.Lead.
func Lead[D DB](ctx context.Context, db D, key txlock.Key, fn func(ctx context.Context, t *txlock.Term) error, opts ...txlock.TermOption) error {
	a, err := termAcquirer(db)
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

// termAcquirer returns the acquirer of a term's attempts on db.
func termAcquirer[D DB](db D) (*acquirer, error) {
	a := &acquirer{}
	if err := a.on(db); err != nil {
		return nil, err
	}
	return a, nil
}

// on makes db the acquirer's, or says why it cannot be.
func (a *acquirer) on(db any) error {
	switch db := db.(type) {
	case *pgxpool.Pool:
		a.pool = db
	case *pgxpool.Conn:
		if db != nil {
			a.conn = db.Conn()
		}
	case *pgx.Conn:
		a.conn = db
	}
	if a.pool == nil && a.conn == nil {
		return fmt.Errorf("%w: db is nil", txlock.ErrInvalidArgument)
	}
	if a.conn != nil && a.conn.PgConn().TxStatus() != 'I' {
		// A busy attempt would abort the caller's transaction, and a grant
		// would commit it with fn's.
		return fmt.Errorf("%w: db is a connection in a transaction; lock inside it with LockTx", txlock.ErrInvalidArgument)
	}
	return nil
}
