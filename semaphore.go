package txlock

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"strconv"

	"github.com/txlock/txlock/driver"
)

// Semaphores: at most n holders of one key at once.
//
// A semaphore of key and n is n slots, each an ordinary advisory lock of
// its own key (SlotKey). An attempt asks for the slots in one statement,
// one after the other, from a slot chosen at random for the call, and stops
// at the first it is granted: a CASE evaluates its branches in order. A
// granted attempt holds exactly one slot, until its transaction ends; a busy
// one holds none. Callers that give different n for the same key share the
// slots they have in common: a caller with n = 4 takes only slots 0 to 3,
// one with n = 8 any of 0 to 7, so at most the largest n of the callers run
// at once, and at most 4 of them are callers with n = 4.

// WithSemaphore runs fn in a transaction that holds one of n slots of key:
// at most n calls with the same key and n, across every process and
// session, run their fn at once. Callers that give different n for the
// same key share the slots they have in common (slot i is SlotKey(key, i),
// and a caller with n takes only slots 0 to n-1): at most the largest n
// of them run at once, and at most m of those that give n = m. It is
// WithLock otherwise (options, events, errors, hold bound, fencing tokens
// and commit rules), except for how it waits, below. n must be between 1
// and MaxKeys.
//
// Which slot the call holds is chosen by the server: the first free one
// from a slot chosen at random, so that callers spread over the slots and
// none is left unused. LockFromContext reports it (Lock.Slot), and
// txlock locks --semaphore NAME=n names it ("semaphore NAME, slot i of n").
// A semaphore waits by polling: it cannot wait in
// the server's lock queue for whichever slot frees first, so WithServerWait
// and WithShared are refused. The local queue admits n callers of a process
// at a time, and hands a slot's turn on as WithLock hands a lock's.
//
// A fencing token (FenceToken) orders the holders of all slots in one
// sequence, so n holders at once hold n different tokens: fence what one
// slot owns (a row per slot, say), not what every slot writes.
func WithSemaphore(ctx context.Context, db DB, key Key, n int, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) error {
	_, err := startCall(ctx, db, fn, []Key{key}, false, semaphoreOpts(n, opts))
	return err
}

// TryWithSemaphore is WithSemaphore with a single attempt: if every slot
// is busy it returns (false, nil) without waiting, and fn does not run.
func TryWithSemaphore(ctx context.Context, db DB, key Key, n int, fn func(ctx context.Context, tx *sql.Tx) error, opts ...Option) (acquired bool, err error) {
	return startCall(ctx, db, fn, []Key{key}, true, semaphoreOpts(n, opts))
}

// semaphoreOpts are opts, with a last option that makes the call a
// semaphore of n slots. A DB-driver package passes them to DriverLock.
func semaphoreOpts(n int, opts []Option) []Option {
	return append(opts[:len(opts):len(opts)], func(c *config) {
		if n < 1 || n > MaxKeys {
			c.fail("a semaphore's n must be between 1 and MaxKeys (%d), got %d", MaxKeys, n)
			return
		}
		c.slots = n
	})
}

// DriverSemaphore is WithSemaphore, or with try TryWithSemaphore, whose
// attempts a driver makes: how pgxlock's WithSemaphore reuses txlock's.
func DriverSemaphore(ctx context.Context, a driver.Acquirer, key Key, n int, try bool, opts ...Option) (acquired bool, err error) {
	return DriverLock(ctx, a, []Key{key}, try, semaphoreOpts(n, opts)...)
}

// semaphoreKeys returns the keys of the n slots of key, in slot order, for
// a call that c makes a semaphore (c.slots > 0), and the slot, picked at
// random, that its attempts ask for first; else keys, unchanged.
func (c *config) semaphoreKeys(keys []Key) (slots []Key, first int, err error) {
	if c.slots == 0 {
		return keys, 0, nil
	}
	if len(keys) != 1 {
		return nil, 0, fmt.Errorf("%w: a semaphore has one key, got %d", ErrInvalidArgument, len(keys))
	}
	slots = make([]Key, c.slots)
	for i := range slots {
		if slots[i] = SlotKey(keys[0], i); slots[i].err != nil {
			return nil, 0, slots[i].err
		}
	}
	return slots, rand.IntN(c.slots), nil
}

// SlotKey returns the advisory key of slot i (from 0) of a semaphore of key
// (WithSemaphore): the bigint made of the first 8 bytes of the SHA-256 of
// a tag byte, key, and i, read big-endian as a signed int64. For a bigint
// key k, and for a pair key (a, b), this SQL gives the same number, so that
// a session can take slot i by hand with pg_advisory_xact_lock:
//
//	('x' || left(encode(sha256('\x01'::bytea || int8send(k) || int4send(i)), 'hex'), 16))::bit(64)::bigint
//	('x' || left(encode(sha256('\x02'::bytea || int4send(a) || int4send(b) || int4send(i)), 'hex'), 16))::bit(64)::bigint
//
// A slot's key does not depend on n, which is why callers with different
// n share slots. i must be between 0 and MaxKeys-1; an invalid key or i
// gives a Key that carries the error (see InvalidKey).
func SlotKey(key Key, i int) Key {
	if err := key.Err(); err != nil {
		return InvalidKey(err)
	}
	if i < 0 || i >= MaxKeys {
		return InvalidKey(fmt.Errorf("%w: slot %d of %s: a slot is between 0 and MaxKeys-1 (%d)", ErrInvalidKey, i, key, MaxKeys-1))
	}
	var msg [13]byte
	b := msg[:1]
	if key.kind == kindPair {
		b[0] = 2
		b = binary.BigEndian.AppendUint32(b, uint32(key.a))
		b = binary.BigEndian.AppendUint32(b, uint32(key.b))
	} else {
		b[0] = 1
		b = binary.BigEndian.AppendUint64(b, uint64(key.v))
	}
	b = binary.BigEndian.AppendUint32(b, uint32(i))
	sum := sha256.Sum256(b)
	return Int64Key(int64(binary.BigEndian.Uint64(sum[:8])))
}

// semaphoreStatement builds a semaphore's polling lock statement (see
// lockStatement for the rules it follows). Its row count is the slot
// granted plus one, or 0 if every slot is busy; a server in recovery fails
// it with standbyMarker, as lockStatement's own form:
//
//	SELECT 1 FROM pg_catalog.generate_series(1, CASE
//	  WHEN pg_catalog.pg_is_in_recovery() THEN CAST(pg_catalog.set_config('txlock.in_recovery', '<standbyMarker>', true) AS integer)
//	  WHEN pg_catalog.pg_try_advisory_xact_lock('<slot first>'::bigint) THEN <first+1>
//	  WHEN pg_catalog.pg_try_advisory_xact_lock('<slot first+1>'::bigint) THEN <first+2>
//	  ... every slot once, wrapping round to slot 0 ...
//	  ELSE 0 END)
//
// With a hold bound, idle_in_transaction_session_timeout is set first, as
// in lockStatement. With a hold bound or a holder's label, what must follow
// a grant is set in a CASE around the slots' CASE, which runs once, in a
// subquery that OFFSET 0 keeps the planner from inlining:
//
//	ELSE (SELECT CASE WHEN s.slot OPERATOR(pg_catalog.=) 0 THEN 0
//	  <transaction_timeout, application_name> ELSE s.slot END
//	  FROM (SELECT CASE <the slots> ELSE 0 END AS slot OFFSET 0) AS s) END)
func semaphoreStatement(s lockSpec, prefix ...string) string {
	b := make([]byte, 0, 256+80*len(s.keys))
	for _, x := range prefix {
		b = append(b, x...)
	}
	b = appendInRecovery(append(b, "SELECT 1 FROM pg_catalog.generate_series(1, CASE WHEN "...), s.readWrite)
	b = append(b, " THEN CAST(pg_catalog.set_config('txlock.in_recovery', '"+standbyMarker+"', true) AS integer)"...)
	b = appendHoldBound(b, s.maxHold, " THEN 0")
	afterGrant := s.maxHold > 0 || s.owner != ""
	if afterGrant {
		b = append(b, " ELSE (SELECT CASE WHEN s.slot OPERATOR(pg_catalog.=) 0 THEN 0"...)
		b = appendTxTimeout(b, s.maxHold, " THEN 0")
		b = appendOwner(b, s.owner, " THEN 0")
		b = append(b, " ELSE s.slot END FROM (SELECT CASE"...)
	}
	n := len(s.keys)
	for j := range n {
		i := (s.first + j) % n
		b = append(b, " WHEN pg_catalog.pg_try_advisory_xact_lock("...)
		b = appendSQLArgs(b, s.keys[i])
		b = append(b, ") THEN "...)
		b = strconv.AppendInt(b, int64(i+1), 10)
	}
	b = append(b, " ELSE 0 END"...)
	if afterGrant {
		b = append(b, " AS slot OFFSET 0) AS s) END"...)
	}
	return string(append(b, ')'))
}
