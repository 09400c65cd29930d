package txlock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// DefaultTimeout bounds how long WithLock and LockTx wait for a lock when no
// WithTimeout option is given. The context's deadline applies too: the earlier
// of the two wins.
const DefaultTimeout = 5 * time.Second

// serializationRetries is WithSerializationRetries's default when
// WithTxOptions sets the isolation to RepeatableRead or Serializable.
const serializationRetries = 3

// Option configures one call of WithLock, WithLocks, TryWithLock,
// TryWithLocks, LockTx or TryLockTx. Options are validated before the
// database is touched; an invalid one makes the call return an error matching
// ErrInvalidArgument.
type Option func(*config)

// A TermOption configures a term (AcquireTerm, TryAcquireTerm, Lead): an
// Option, or one of the term's own, WithHeartbeat and WithTermFencer, which
// no other call takes. A term refuses some Options (see AcquireTerm).
type TermOption interface{ applyTerm(*config) }

func (o Option) applyTerm(c *config) { o(c) }

// termOption is an option of terms only.
type termOption func(*config)

func (o termOption) applyTerm(c *config) { o(c) }

// termOptions returns opts as Options, for config.init; a nil one is
// refused there.
func termOptions(opts []TermOption) []Option {
	all := make([]Option, 0, len(opts))
	for _, o := range opts {
		switch o := o.(type) {
		case Option:
			all = append(all, o)
		case termOption:
			all = append(all, Option(o))
		case nil:
			all = append(all, nil)
		default: // a type that embeds a TermOption
			all = append(all, o.applyTerm)
		}
	}
	return all
}

// clock is the wait's time seam: the real clock, except in tests.
type clock interface {
	now() time.Time
	// sleep waits for d or until ctx ends, and reports whether d elapsed.
	sleep(ctx context.Context, d time.Duration) bool
}

type realClock struct{}

func (realClock) now() time.Time                                  { return time.Now() }
func (realClock) sleep(ctx context.Context, d time.Duration) bool { return sleep(ctx, d) }

type config struct {
	timeout    time.Duration
	retry      RetryStrategy
	retrySet   bool
	serverWait *ServerWait // set by WithServerWait
	// headWindow is set for DefaultRetry in the WithLock family at
	// ReadCommitted: a call for one key that has its local queue's turn,
	// on a pool with an idle connection, makes its attempts ServerWait
	// windows of DefaultServerWaitWindow (see waiter.window).
	headWindow    bool
	clock         clock
	inTx          bool     // LockTx, TryLockTx: the lock lives in the caller's transaction
	obs           Observer // set by New and WithObserver; the call's events go to it (see lockState.ev)
	shared        bool
	txOpts        *sql.TxOptions
	maxHold       time.Duration
	owner         string // WithOwner's label
	failOpen      bool
	logger        *slog.Logger
	serialRetries int
	serialSet     bool
	fencing       bool     // WithFencing: a draw connection is set aside before the lock
	slots         int      // a semaphore's n (WithSemaphore), 0 for a lock
	onlyOwnTx     []string // options that make no sense inside a caller's tx
	// term is set for AcquireTerm, TryAcquireTerm and Lead (see term.go);
	// heartbeat and fencer are their options.
	term      bool
	heartbeat Heartbeat
	fencer    Fencer
	fromNew   []string // the options a term refuses that a Locker's New set (see fromLocker)
	errs      []error
}

func (c *config) fail(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...))
}

// WithTimeout bounds the wait for the lock. d must be positive. Without it,
// DefaultTimeout applies. The context's deadline, if earlier, wins.
func WithTimeout(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithTimeout needs a positive duration, got %v", d)
		}
		c.timeout = d
	}
}

// WithRetry sets how long to sleep between polling attempts. Every strategy
// but DefaultRetry, the one used without WithRetry, polls only. Waiters hold
// no connection while they sleep. Callers that poll lose releases to those
// that wait in the server (the default's, WithServerWait's), so a key's
// callers in every process should use the same kind. A strategy other than
// DefaultRetry cannot be combined with WithServerWait, which waits in the
// server instead of sleeping.
func WithRetry(s RetryStrategy) Option {
	return func(c *config) {
		if s == nil {
			c.fail("WithRetry needs a strategy, got nil")
			return
		}
		if v, ok := s.(interface{ Validate() error }); ok {
			if err := v.Validate(); err != nil {
				c.fail("%s", strings.TrimPrefix(err.Error(), "txlock: "))
			}
		}
		_, isDefault := s.(defaultRetry)
		c.retry, c.retrySet = s, !isDefault
	}
}

// WithServerWait makes each attempt wait for the lock in PostgreSQL's own
// lock queue, for at most s.Window, instead of polling: see ServerWait. It
// is an option of its own, rather than a RetryStrategy, because it changes
// what an attempt is (a wait in the server that holds a connection), not
// how long to sleep between attempts. It cannot be combined with a
// WithRetry strategy other than DefaultRetry.
// TryWithLock, TryWithLocks and TryLockTx never wait in the server.
func WithServerWait(s ServerWait) Option {
	return func(c *config) {
		if err := s.Validate(); err != nil {
			c.fail("%s", strings.TrimPrefix(err.Error(), "txlock: "))
		}
		c.serverWait = &s
	}
}

// WithObserver sets the Observer of the call's lock events, in place of the
// one New gave its Locker. WithObserver(nil) reports nothing.
func WithObserver(o Observer) Option {
	return func(c *config) { c.obs = o }
}

// WithShared takes shared (reader) locks, with
// pg_try_advisory_xact_lock_shared: holders of a shared lock exclude
// exclusive holders but not each other.
func WithShared() Option {
	return func(c *config) { c.shared = true }
}

// WithTxOptions sets the isolation level and read-only flag of the lock's
// transaction. It applies only to the functions that begin the transaction.
//
// Under RepeatableRead and Serializable the transaction snapshot is taken by
// its first statement, the lock statement, an instant before the lock is
// granted: a previous holder that commits in that instant is invisible to fn.
// PostgreSQL then fails fn's updates of rows that holder changed with
// SQLSTATE 40001, and WithLock re-runs fn (see WithSerializationRetries).
// Reads alone are not checked; prefer the default ReadCommitted, where every
// statement of fn sees all that committed before the lock was granted.
// ServerWait is refused above ReadCommitted, whether the level comes from
// here or from the server (see ServerWait).
func WithTxOptions(opts *sql.TxOptions) Option {
	return func(c *config) {
		c.txOpts = opts
		c.onlyOwnTx = append(c.onlyOwnTx, "WithTxOptions")
	}
}

// WithMaxHold caps how long the lock may be held, from the moment it is
// granted.
//
// Client side, the context passed to fn gets that deadline, and the
// transaction is rolled back when it passes (database/sql rolls back a
// transaction whose context ends); the call then returns an error matching
// ErrHoldTimeout. Server side, the lock statement sets, for the transaction
// only (SET LOCAL semantics):
//   - idle_in_transaction_session_timeout to d, so that a holder process
//     that freezes between statements loses its session, and with it the
//     lock, d after its last statement;
//   - on PostgreSQL 17 and later, once every lock is granted,
//     transaction_timeout to d plus a margin (a tenth of d, at least 20ms and
//     at most 1s), so that a holder whose statement runs past the bound, or
//     a client frozen while its statement runs, loses them too (SQLSTATE
//     25P04). It counts from the grant on the server, not from BEGIN, and a
//     ServerWait wait does not count. The margin lets fn's own deadline,
//     which starts when the grant reaches the client, pass first, so that
//     the call still returns ErrHoldTimeout. A transaction_timeout already
//     in force (from the server, role, database or connection) is kept if
//     it ends earlier, and replaced by this one otherwise.
//
// The idle bound is set by the first branch of every attempt's statement,
// before any key is tried: a WithLocks attempt granted some of its keys but
// not all holds them until its rollback reaches the server, and if the
// client freezes or is cut off before that, the server still releases them
// at the bound.
//
// On PostgreSQL 16 and earlier only the idle bound applies: a statement that
// does not run under fn's context and outlasts d keeps the lock until it
// ends. d must be positive; it is rounded up to whole milliseconds on the
// server.
//
// In LockTx and TryLockTx only the server-side part applies, to the caller's
// transaction, transaction_timeout included: it counts from the grant
// however old the transaction is, so the caller's transaction ends d plus
// the margin after the lock is granted, whatever it is doing then. An
// attempt that finds the lock busy sets no transaction_timeout.
func WithMaxHold(d time.Duration) Option {
	return func(c *config) {
		if d <= 0 {
			c.fail("WithMaxHold needs a positive duration, got %v", d)
		}
		c.maxHold = d
	}
}

// WithOwner names the lock's holder for operators: once the lock is
// granted, its transaction's application_name is label, which
// pg_stat_activity and `txlock locks` show beside the lock while it is
// held. The name is set by the lock statement itself, with no round trip
// of its own, and only once the lock is granted; it ends with the
// transaction, which sets the session's own name back (behind PgBouncer
// too: the next client of the server connection sees its own name). label
// must be 1 to 63 printable ASCII characters (application_name's limit),
// else the call fails with ErrInvalidArgument; an empty label is refused
// too, not taken for none. Build it from what identifies the caller, such
// as the service, a host, a pid and a request's id: it replaces the
// session's own name while the lock is held. Every role can read
// application_name in pg_stat_activity, and the server's log can show it
// (log_line_prefix's %a): put no secret or personal data in it. It is off
// by default. A term's label lasts as long as the term (AcquireTerm, Lead):
// operators see which process leads.
func WithOwner(label string) Option {
	return func(c *config) {
		if err := checkOwner(label); err != "" {
			c.fail("WithOwner: %s", err)
		}
		c.owner = label
	}
}

// checkOwner says what is wrong with a WithOwner label, or "".
func checkOwner(label string) string {
	switch {
	case label == "":
		return "the label is empty"
	case len(label) > 63:
		return fmt.Sprintf("the label is %d bytes, longer than application_name's 63", len(label))
	}
	for i := 0; i < len(label); i++ {
		if c := label[i]; c < 0x20 || c > 0x7e {
			return fmt.Sprintf("the label %q holds a byte (%#02x at %d) that is not printable ASCII, which the server would replace", label, c, i)
		}
	}
	return ""
}

// WithFailOpen makes WithLock and WithLocks run fn without the lock when the
// lock cannot be had before the timeout set by WithTimeout (or
// DefaultTimeout) passes. It is never the default: use it only where running
// unguarded is better than not running at all.
//
// When it happens, a warning is logged to logger (slog.Default() if nil), and
// Held(ctx) is false inside fn. It does not apply when the caller's context
// ends, when the server is a standby, or on any other error.
func WithFailOpen(logger *slog.Logger) Option {
	return func(c *config) {
		c.failOpen = true
		c.logger = logger
		c.onlyOwnTx = append(c.onlyOwnTx, "WithFailOpen")
	}
}

// WithSerializationRetries sets how many times WithLock re-runs fn, in a new
// transaction that takes the lock again, when fn or the commit fails with
// SQLSTATE 40001 (serialization_failure) or 40P01 (deadlock_detected). fn
// must then be safe to run more than once: keep side effects outside the
// database out of it, or pass 0.
//
// The default is 3 for RepeatableRead and
// Serializable transactions (see WithTxOptions for why), and 0 otherwise.
// The level is the one WithTxOptions sets: where it comes from the server's
// default_transaction_isolation instead, the default is 0, so pass this
// option. n must not be negative.
func WithSerializationRetries(n int) Option {
	return func(c *config) {
		if n < 0 {
			c.fail("WithSerializationRetries needs n >= 0, got %d", n)
		}
		c.serialRetries = n
		c.serialSet = true
		c.onlyOwnTx = append(c.onlyOwnTx, "WithSerializationRetries")
	}
}

// WithFencing says that fn draws fencing tokens (FenceToken, Fencer.Token):
// before the lock is taken, one connection of db's pool is set aside for
// draws, so that a holder never waits for a pool connection to draw on. It
// is shared by every call of this process on that pool that gives this
// option, serves their draws one at a time, and goes back to the pool when
// the last of them has ended. While it is set aside it stays in a
// transaction of its own, which keeps its server connection behind a
// transaction-mode pooler such as PgBouncer (docs/fencing.md says what an
// operator sees of it). Without this option, a draw takes a connection
// from the pool, and one on a pool whose connections are all in use (all
// held by holders, say, each about to draw) fails at once with ErrNoToken.
//
// Setting the connection aside is the first part of the lock wait, before
// the call takes anything: it counts against WithTimeout, and a wait that
// ends there ends as any wait does (LockTimeoutError or CanceledError, with
// no attempt; WithFailOpen does not apply to it). Each draw on the
// connection is bounded by 10 seconds, and does not end when the drawing
// fn's context does, so that a holder that gives up does not break the
// connection for the others. A draw that breaks the connection (an error
// the server did not send, a connection exception, or the server ending
// the session) closes it, and so does a commit of a draw that fails (that
// draw returns no token); until a later call sets another aside, draws are
// made as without this option. A draw that fails otherwise (a missing
// sequence, say) leaves it in use.
//
// db must be a pool (*sql.DB, *sqlx.DB, *pgxpool.Pool) that allows two
// connections at least; otherwise the call returns ErrInvalidArgument. It
// applies to the WithLock family and to terms, whose start draws a token
// (a term keeps the reservation while it campaigns); not inside a caller's
// transaction (LockTx), where fn has no tokens.
func WithFencing() Option {
	return func(c *config) {
		c.fencing = true
		c.onlyOwnTx = append(c.onlyOwnTx, "WithFencing")
	}
}

// init sets c from the defaults and opts. inTx is true for LockTx and
// TryLockTx. c lives inside the call's own state, so that a call costs one
// allocation fewer.
func (c *config) init(opts []Option, inTx bool) error {
	*c = config{timeout: DefaultTimeout, retry: defaultRetry{}, clock: realClock{}, inTx: inTx}
	for _, o := range opts {
		if o == nil {
			c.fail("nil Option")
			continue
		}
		o(c)
	}
	if inTx {
		for _, name := range c.onlyOwnTx {
			c.fail("%s does not apply inside a caller's transaction (LockTx, TryLockTx)", name)
		}
	}
	if err := errors.Join(c.errs...); err != nil {
		return err
	}
	if !c.serialSet && c.txOpts != nil && c.txOpts.Isolation >= sql.LevelRepeatableRead {
		c.serialRetries = serializationRetries
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	if c.serverWait != nil {
		if c.retrySet {
			return fmt.Errorf("%w: WithServerWait cannot be combined with a WithRetry strategy other than DefaultRetry: a ServerWait attempt waits in the server instead of sleeping (its Pause spaces the windows)", ErrInvalidArgument)
		}
		if c.txOpts != nil && c.txOpts.Isolation >= sql.LevelRepeatableRead {
			// The snapshot would be taken by the waiting statement, before
			// the previous holder commits: fn would not see its writes.
			return fmt.Errorf("%w: ServerWait needs ReadCommitted: under %v the snapshot is taken before the wait, so fn would not see the previous holder's writes", ErrInvalidArgument, c.txOpts.Isolation)
		}
	}
	if c.slots > 0 {
		switch {
		case c.shared:
			return fmt.Errorf("%w: WithShared does not apply to a semaphore: each holder takes a slot of its own", ErrInvalidArgument)
		case c.serverWait != nil:
			return fmt.Errorf("%w: WithServerWait does not apply to a semaphore: the server's lock queue waits for one slot, not for whichever of the n frees first; a semaphore polls", ErrInvalidArgument)
		}
	}
	_, isDefault := c.retry.(defaultRetry)
	c.headWindow = isDefault && c.serverWait == nil && !inTx && !c.term && c.slots == 0 &&
		(c.txOpts == nil || c.txOpts.Isolation < sql.LevelRepeatableRead)
	if c.term {
		return c.forTerm()
	}
	return nil
}

// forTerm refuses the options that do not apply to a term, and sets the
// term's transaction options: the end of init for a term's config.
func (c *config) forTerm() error {
	var errs []error
	for _, r := range c.termRefusals() {
		err := fmt.Errorf("%w: %s", ErrInvalidArgument, r.why)
		if slices.Contains(c.fromNew, r.name) {
			err = fmt.Errorf("%w (%s was given to New, which sets it for every call of the Locker: build a Locker without it for terms)", err, r.name)
		}
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Read committed whatever the server's default_transaction_isolation
	// says, and read only: the term's transaction makes no writes.
	c.txOpts = &sql.TxOptions{Isolation: sql.LevelReadCommitted, ReadOnly: true}
	return nil
}

// termRefusal is an option that a term refuses: its name, and the error's
// text.
type termRefusal struct{ name, why string }

// termRefusals lists the options set in c that a term refuses.
func (c *config) termRefusals() []termRefusal {
	var r []termRefusal
	refuse := func(name, why string) {
		r = append(r, termRefusal{name, name + " does not apply to a term: " + why})
	}
	if c.shared {
		refuse("WithShared", "a term is exclusive")
	}
	if c.serverWait != nil {
		refuse("WithServerWait", "its waiter holds a connection, and a candidate must hold none while it waits")
	}
	if c.maxHold > 0 {
		refuse("WithMaxHold", "a term lasts as long as its heartbeats succeed; bound a frozen holder with WithHeartbeat's TTL")
	}
	if c.failOpen {
		refuse("WithFailOpen", "a term without the lock would be no term")
	}
	if c.serialSet {
		refuse("WithSerializationRetries", "a term runs no fn in its transaction")
	}
	switch o := c.txOpts; {
	case o == nil || o.Isolation == sql.LevelDefault || o.Isolation == sql.LevelReadCommitted:
	case o.Isolation < sql.LevelReadCommitted:
		r = append(r, termRefusal{"WithTxOptions", fmt.Sprintf("a term needs ReadCommitted, and WithTxOptions asks for %v: a term's transaction is always begun READ COMMITTED; leave the option out, or ask for ReadCommitted", o.Isolation)})
	default:
		r = append(r, termRefusal{"WithTxOptions", fmt.Sprintf("a term needs ReadCommitted, and WithTxOptions asks for %v: a transaction above it keeps its snapshot, and holds back vacuum, for the whole term", o.Isolation)})
	}
	return r
}
