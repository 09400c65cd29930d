// Package checker is test support for txlock's reliability suite: a
// deliberately racy ledger workload that any test can run under load and
// while faults are injected, and the SQL checks that prove the lock held.
//
// Each critical section moves money between two accounts guarded by the
// lock: it records its entry (clock_timestamp() and the backend pid), reads
// both balances, sleeps, writes both back and appends one history row per
// account, then records its exit. Without mutual exclusion sections overlap
// and updates are lost; Check counts both, from any snapshot of the tables,
// while the workload runs or after it stopped.
package checker

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/txlock/txlock"
	"github.com/txlock/txlock/pgxlock"
)

// Locker is how a section takes its keys: it runs fn holding every key of
// keys, in a transaction begun on the run's pool, with txlock on a
// database/sql pool (Start) and with pgxlock on a pgx pool (StartPgx). It is
// Locked, or Unlocked for the control runs that show the checks can fail.
type Locker struct {
	sql func(ctx context.Context, db txlock.DB, keys []txlock.Key, fn func(context.Context, *sql.Tx) error) error
	pgx func(ctx context.Context, db *pgxpool.Pool, keys []txlock.Key, fn func(context.Context, pgx.Tx) error) error
}

// Locked returns the Locker that takes one key with WithLock and several
// with WithLocks (txlock's, or pgxlock's on a pgx pool), passing opts.
func Locked(opts ...txlock.Option) Locker {
	return Locker{
		sql: func(ctx context.Context, db txlock.DB, keys []txlock.Key, fn func(context.Context, *sql.Tx) error) error {
			if len(keys) == 1 {
				return txlock.WithLock(ctx, db, keys[0], fn, opts...)
			}
			return txlock.WithLocks(ctx, db, keys, fn, opts...)
		},
		pgx: func(ctx context.Context, db *pgxpool.Pool, keys []txlock.Key, fn func(context.Context, pgx.Tx) error) error {
			if len(keys) == 1 {
				return pgxlock.WithLock(ctx, db, keys[0], fn, opts...)
			}
			return pgxlock.WithLocks(ctx, db, keys, fn, opts...)
		},
	}
}

// Unlocked returns a Locker that takes no lock: it runs fn in a plain
// transaction. It exists for control runs, which must show violations.
func Unlocked() Locker {
	return Locker{
		sql: func(ctx context.Context, db txlock.DB, _ []txlock.Key, fn func(context.Context, *sql.Tx) error) error {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback() }()
			if err := fn(ctx, tx); err != nil {
				return err
			}
			return tx.Commit()
		},
		pgx: func(ctx context.Context, db *pgxpool.Pool, _ []txlock.Key, fn func(context.Context, pgx.Tx) error) error {
			tx, err := db.BeginTx(ctx, pgx.TxOptions{})
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if err := fn(ctx, tx); err != nil {
				return err
			}
			return tx.Commit(ctx)
		},
	}
}

// sectionTx is the transaction a section runs in, whichever the driver.
type sectionTx interface {
	exec(ctx context.Context, query string, args ...any) error
	query(ctx context.Context, query string, args ...any) (sectionRows, error)
}

// sectionRows is what a section reads of a query's result.
type sectionRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

type sqlTx struct{ tx *sql.Tx }

func (t sqlTx) exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.ExecContext(ctx, query, args...)
	return err
}

func (t sqlTx) query(ctx context.Context, query string, args ...any) (sectionRows, error) {
	return t.tx.QueryContext(ctx, query, args...)
}

// pgxTx runs a section's statements in the pool's exec mode.
type pgxTx struct{ tx pgx.Tx }

func (t pgxTx) exec(ctx context.Context, query string, args ...any) error {
	_, err := t.tx.Exec(ctx, query, args...)
	return err
}

func (t pgxTx) query(ctx context.Context, query string, args ...any) (sectionRows, error) {
	rows, err := t.tx.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	return pgxRows{rows}, nil
}

// pgxRows reports the result's error in Err alone: pgx closes the rows, and
// settles it, once Next has returned false.
type pgxRows struct{ pgx.Rows }

func (r pgxRows) Close() error {
	r.Rows.Close()
	return nil
}

// Config describes a ledger workload. Zero fields take the defaults noted.
type Config struct {
	Keys        int           // lock keys; each guards two accounts (default 8)
	Sleep       time.Duration // between the read and the write (default 1ms)
	CrossKeyPct int           // share of sections that move money between two keys, in percent (default 50; negative means none)
	Lock        Locker        // how a section takes its keys (default Locked with a 30s timeout)
	ErrorPause  time.Duration // a worker's pause after a failed call (default 5ms)
	// Tokens makes each section draw a fencing token first
	// (txlock.FenceToken), recorded in its Outcome.
	Tokens bool
}

// InitialBalance is every account's balance before the run.
const InitialBalance = 1_000_000

// Ledger is the workload's state: its tables, on a database reached through
// admin, and its keys.
type Ledger struct {
	cfg    Config
	admin  *sql.DB
	prefix string
	ks     txlock.Keyspace
	keys   []txlock.Key
	nextID atomic.Int64 // section ids, unique across runs of the ledger
}

// New creates the ledger's tables through admin, a pool connected directly
// to PostgreSQL (never through a pooler that a test may kill). Drop removes
// them.
func New(ctx context.Context, admin *sql.DB, cfg Config) (*Ledger, error) {
	if cfg.Keys <= 0 {
		cfg.Keys = 8
	}
	if cfg.Sleep == 0 {
		cfg.Sleep = time.Millisecond
	}
	if cfg.CrossKeyPct == 0 {
		cfg.CrossKeyPct = 50
	}
	if cfg.Lock.sql == nil {
		cfg.Lock = Locked(txlock.WithTimeout(30 * time.Second))
	}
	if cfg.ErrorPause == 0 {
		cfg.ErrorPause = 5 * time.Millisecond
	}
	var b [5]byte
	_, _ = rand.Read(b[:])
	l := &Ledger{cfg: cfg, admin: admin, prefix: "ledger_" + hex.EncodeToString(b[:])}
	l.ks = txlock.NewKeyspace(l.prefix)
	for k := range cfg.Keys {
		l.keys = append(l.keys, l.ks.ID(int32(k)))
	}
	ddl := strings.NewReplacer("$P", l.prefix).Replace(`
		CREATE TABLE $P_accounts (
			id      bigint PRIMARY KEY,
			key     bigint NOT NULL,
			initial bigint NOT NULL,
			balance bigint NOT NULL,
			version bigint NOT NULL DEFAULT 0);
		CREATE TABLE $P_history (
			account bigint NOT NULL,
			version bigint NOT NULL,
			before  bigint NOT NULL,
			after   bigint NOT NULL,
			sid     bigint NOT NULL);
		CREATE INDEX ON $P_history (account, version);
		CREATE TABLE $P_sections (
			sid   bigint NOT NULL,
			key   bigint NOT NULL,
			pid   int NOT NULL,
			enter timestamptz NOT NULL,
			exit  timestamptz);
		CREATE INDEX ON $P_sections (sid);`)
	if _, err := admin.ExecContext(ctx, ddl); err != nil {
		return nil, fmt.Errorf("checker: creating the ledger tables: %w", err)
	}
	if _, err := admin.ExecContext(ctx, `INSERT INTO `+l.prefix+`_accounts (id, key, initial, balance)
		SELECT a, a / 2, $1, $1 FROM generate_series(0, $2::bigint - 1) a`, InitialBalance, 2*cfg.Keys); err != nil {
		return nil, fmt.Errorf("checker: creating the accounts: %w", err)
	}
	return l, nil
}

// Drop removes the ledger's tables.
func (l *Ledger) Drop(ctx context.Context) error {
	_, err := l.admin.ExecContext(ctx, `DROP TABLE IF EXISTS `+l.prefix+`_accounts, `+l.prefix+`_history, `+l.prefix+`_sections`)
	return err
}

// Keys returns the ledger's lock keys.
func (l *Ledger) Keys() []txlock.Key { return l.keys }

// Table returns the name of one of the ledger's tables: "accounts",
// "history" or "sections".
func (l *Ledger) Table(name string) string { return l.prefix + "_" + name }

// move is one section's plan: which keys it locks, and the transfer.
type move struct {
	sid      int64
	keys     []int
	from, to int64
	amount   int64
}

func (l *Ledger) plan(r *mrand.Rand) move {
	m := move{sid: l.nextID.Add(1), amount: 1 + r.Int64N(100)}
	k1 := r.IntN(l.cfg.Keys)
	if l.cfg.Keys > 1 && r.IntN(100) < l.cfg.CrossKeyPct {
		k2 := r.IntN(l.cfg.Keys - 1)
		if k2 >= k1 {
			k2++
		}
		m.keys = []int{k1, k2}
		m.from, m.to = int64(2*k1+r.IntN(2)), int64(2*k2+r.IntN(2))
	} else {
		b := r.IntN(2)
		m.keys = []int{k1}
		m.from, m.to = int64(2*k1+b), int64(2*k1+1-b)
	}
	return m
}

// section is the critical section: a racy read-sleep-write transfer that
// records its entry and exit.
func (l *Ledger) section(ctx context.Context, tx sectionTx, m move) error {
	var sb strings.Builder
	args := []any{m.sid}
	sb.WriteString(`INSERT INTO ` + l.prefix + `_sections (sid, key, pid, enter) VALUES `)
	for i, k := range m.keys {
		if i > 0 {
			sb.WriteString(", ")
		}
		args = append(args, int64(k))
		fmt.Fprintf(&sb, "($1, $%d, pg_backend_pid(), clock_timestamp())", len(args))
	}
	if err := tx.exec(ctx, sb.String(), args...); err != nil {
		return err
	}
	rows, err := tx.query(ctx, `SELECT id, balance, version FROM `+l.prefix+`_accounts WHERE id IN ($1, $2)`, m.from, m.to)
	if err != nil {
		return err
	}
	type acct struct{ balance, version int64 }
	seen := map[int64]acct{}
	for rows.Next() {
		var id int64
		var a acct
		if err := rows.Scan(&id, &a.balance, &a.version); err != nil {
			rows.Close()
			return err
		}
		seen[id] = a
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return err
	}
	if len(seen) != 2 {
		return fmt.Errorf("checker: accounts %d and %d: read %d rows", m.from, m.to, len(seen))
	}
	time.Sleep(l.cfg.Sleep)
	writes := []struct {
		id    int64
		delta int64
	}{{m.from, -m.amount}, {m.to, m.amount}}
	if m.to < m.from {
		// Rows in id order: unlocked control runs must not deadlock on them.
		writes[0], writes[1] = writes[1], writes[0]
	}
	for _, w := range writes {
		a := seen[w.id]
		if err := tx.exec(ctx, `WITH h AS (INSERT INTO `+l.prefix+`_history (account, version, before, after, sid)
				VALUES ($1, $2, $3, $4, $5))
			UPDATE `+l.prefix+`_accounts SET balance = $4, version = $2 WHERE id = $1`,
			w.id, a.version+1, a.balance, a.balance+w.delta, m.sid); err != nil {
			return err
		}
	}
	return tx.exec(ctx, `UPDATE `+l.prefix+`_sections SET exit = clock_timestamp() WHERE sid = $1`, m.sid)
}

// Outcome is the result of one call of the Locker, as the caller saw it.
type Outcome struct {
	SID   int64
	Class string // "ok", or the error's class (see Classify)
	// Commit is true when the error came from the commit itself, after fn
	// returned nil: whether the transaction committed is then unknown.
	Commit bool
	// Start and End are when the call began and returned.
	Start, End time.Time
	// Token is the fencing token the section drew (Config.Tokens), 0 if
	// none, and Drawn when the draw returned it.
	Token int64
	Drawn time.Time
}

// Run is a workload running on one pool.
type Run struct {
	l       *Ledger
	lock    func(ctx context.Context, keys []txlock.Key, fn func(context.Context, sectionTx) error) error
	target  int64
	workers int
	stopped atomic.Bool
	wg      sync.WaitGroup
	start   time.Time

	acquired atomic.Int64 // calls that returned nil
	calls    atomic.Int64
	failed   atomic.Int64

	mu       sync.Mutex
	outcomes []Outcome
	classes  map[string]int
	samples  map[string]string
}

// Start runs workers goroutines, each calling the Locker in a loop on db,
// until Stop, or until target calls have succeeded (0: no target).
func (l *Ledger) Start(db txlock.DB, workers int, target int64) *Run {
	return l.start(workers, target, func(ctx context.Context, keys []txlock.Key, fn func(context.Context, sectionTx) error) error {
		return l.cfg.Lock.sql(ctx, db, keys, func(ctx context.Context, tx *sql.Tx) error { return fn(ctx, sqlTx{tx}) })
	})
}

// StartPgx is Start on a pgx pool: the Locker takes the keys with pgxlock,
// and the sections run on its pgx.Tx, in the pool's exec mode.
func (l *Ledger) StartPgx(db *pgxpool.Pool, workers int, target int64) *Run {
	return l.start(workers, target, func(ctx context.Context, keys []txlock.Key, fn func(context.Context, sectionTx) error) error {
		return l.cfg.Lock.pgx(ctx, db, keys, func(ctx context.Context, tx pgx.Tx) error { return fn(ctx, pgxTx{tx}) })
	})
}

func (l *Ledger) start(workers int, target int64, lock func(context.Context, []txlock.Key, func(context.Context, sectionTx) error) error) *Run {
	r := &Run{l: l, lock: lock, target: target, workers: workers, start: time.Now(), classes: map[string]int{}, samples: map[string]string{}}
	for w := range workers {
		r.wg.Add(1)
		go r.worker(uint64(w))
	}
	return r
}

func (r *Run) worker(seed uint64) {
	defer r.wg.Done()
	rng := mrand.New(mrand.NewPCG(seed, uint64(time.Now().UnixNano())))
	var outcomes []Outcome
	defer func() {
		r.mu.Lock()
		r.outcomes = append(r.outcomes, outcomes...)
		r.mu.Unlock()
	}()
	ctx := context.Background()
	keys := make([]txlock.Key, 0, 2)
	for !r.stopped.Load() && (r.target == 0 || r.acquired.Load() < r.target) {
		m := r.l.plan(rng)
		keys = keys[:0]
		for _, k := range m.keys {
			keys = append(keys, r.l.keys[k])
		}
		fnDone := false
		o := Outcome{SID: m.sid, Start: time.Now()}
		err := r.lock(ctx, keys, func(ctx context.Context, tx sectionTx) error {
			if r.l.cfg.Tokens {
				token, err := txlock.FenceToken(ctx)
				if err != nil {
					return err
				}
				o.Token, o.Drawn = token, time.Now()
			}
			err := r.l.section(ctx, tx, m)
			fnDone = err == nil
			return err
		})
		r.calls.Add(1)
		o.End, o.Class, o.Commit = time.Now(), Classify(err), err != nil && fnDone
		outcomes = append(outcomes, o)
		if err == nil {
			r.acquired.Add(1)
			continue
		}
		r.failed.Add(1)
		r.mu.Lock()
		r.classes[o.Class]++
		if _, ok := r.samples[o.Class]; !ok {
			r.samples[o.Class] = err.Error()
		}
		r.mu.Unlock()
		time.Sleep(r.l.cfg.ErrorPause)
	}
}

// Acquisitions returns how many calls have succeeded so far.
func (r *Run) Acquisitions() int64 { return r.acquired.Load() }

// Failures returns how many calls have failed so far.
func (r *Run) Failures() int64 { return r.failed.Load() }

// WaitFor waits until n more calls than now have succeeded, or timeout
// passes, and reports whether they did.
func (r *Run) WaitFor(n int64, timeout time.Duration) bool {
	want := r.acquired.Load() + n
	deadline := time.Now().Add(timeout)
	for r.acquired.Load() < want {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// Summary is what a Run did.
type Summary struct {
	Workers      int
	Calls        int64
	Acquisitions int64 // calls that returned nil
	Failures     int64
	Duration     time.Duration
	Classes      map[string]int    // failures by class
	Samples      map[string]string // one error message per class
	Outcomes     []Outcome
}

// Stop asks the workers to stop after their current call, waits for them,
// and returns what they did.
func (r *Run) Stop() Summary {
	r.stopped.Store(true)
	return r.Wait()
}

// Wait waits until the run reaches its target (or is stopped) and returns
// what it did.
func (r *Run) Wait() Summary {
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	return Summary{
		Workers:      r.workers,
		Calls:        r.calls.Load(),
		Acquisitions: r.acquired.Load(),
		Failures:     r.failed.Load(),
		Duration:     time.Since(r.start),
		Classes:      r.classes,
		Samples:      r.samples,
		Outcomes:     r.outcomes,
	}
}

// Unexpected returns the failures whose class is not in allowed, as
// "class: sample" lines.
func (s Summary) Unexpected(allowed ...string) []string {
	var out []string
	for c, n := range s.Classes {
		ok := false
		for _, a := range allowed {
			ok = ok || a == c
		}
		if !ok {
			out = append(out, fmt.Sprintf("%s (%d): %s", c, n, s.Samples[c]))
		}
	}
	return out
}

// String summarises the run for logs.
func (s Summary) String() string {
	rate := 0.0
	if s.Duration > 0 {
		rate = float64(s.Acquisitions) / s.Duration.Seconds()
	}
	return fmt.Sprintf("%d calls, %d acquisitions, %d failures %v in %v (%.0f acquisitions/s)",
		s.Calls, s.Acquisitions, s.Failures, s.Classes, s.Duration.Round(time.Millisecond), rate)
}
