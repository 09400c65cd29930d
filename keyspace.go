package txlock

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/txlock/txlock/internal/pgident"
	"strconv"
	"strings"
)

// ErrInvalidKey is matched (with errors.Is) by every error about a malformed
// Key or Keyspace: an empty or non-UTF-8 name, a NUL byte, a zero Key, or an
// undecodable pg_locks row. An invalid key is an invalid argument: such an
// error matches ErrInvalidArgument too.
var ErrInvalidKey error = invalidKey{}

// invalidKey is ErrInvalidKey: a sentinel that also matches
// ErrInvalidArgument.
type invalidKey struct{}

func (invalidKey) Error() string        { return "txlock: invalid key" }
func (invalidKey) Is(target error) bool { return target == ErrInvalidArgument }

type keyKind uint8

const (
	kindNone  keyKind = iota // the zero Key: invalid
	kindInt64                // one bigint: pg_locks objsubid 1
	kindPair                 // two int4s: pg_locks objsubid 2
)

// Key identifies one PostgreSQL advisory lock.
//
// PostgreSQL has two separate advisory key spaces: one bigint, and a pair of
// int4s. A Key holds either. Keys are built by Int64Key, PairKey, StringKey,
// or a Keyspace's Key and ID methods, and are comparable values.
//
// A constructor never fails: a Key built from bad input (an empty name, say)
// carries the error, Err reports it, and every locking function returns it,
// wrapped around ErrInvalidKey, before touching the database.
//
// The zero Key is invalid.
type Key struct {
	kind  keyKind
	v     int64 // kindInt64
	a, b  int32 // kindPair
	label string
	space string // the keyspace's name, for keys of a named keyspace
	err   error
}

// Int64Key returns the key of pg_advisory_xact_lock(n) (the bigint space).
func Int64Key(n int64) Key { return Key{kind: kindInt64, v: n} }

// PairKey returns the key of pg_advisory_xact_lock(a, b) (the int4-pair
// space, separate from the bigint one).
func PairKey(a, b int32) Key { return Key{kind: kindPair, a: a, b: b} }

// StringKey returns a bigint key derived from name: the first 8 bytes of the
// SHA-256 of its UTF-8 bytes, read big-endian as a signed int64. This SQL
// gives the same number:
//
//	('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 16))::bit(64)::bigint
//
// The name must be non-empty, valid UTF-8, and free of NUL bytes (a
// PostgreSQL text value cannot hold NUL, so SQL could not reproduce such a
// key). Any length is accepted; String shows at most the first 64 bytes.
func StringKey(name string) Key {
	if err := checkName(ErrInvalidKey, "key name", name); err != nil {
		return Key{err: err}
	}
	sum := sha256.Sum256([]byte(name))
	return Key{kind: kindInt64, v: int64(binary.BigEndian.Uint64(sum[:8])), label: name}
}

// Keyspace is a namespace of pair keys: every key of a Keyspace has the
// keyspace's int32 namespace as its first half. Give each service its own.
//
// Namespaces derived from names are 32-bit hashes, so two services collide
// with probability about n²/2³³ for n keyspaces (about 1 in 8.6 million for
// two). A collision never breaks exclusion: unrelated keys that happen to be
// equal only serialize with each other. The same holds for the 32-bit name
// hash within a keyspace: with k distinct names in use at once, the chance
// that some two share a lock is about k²/2³³.
//
// The zero Keyspace is namespace 0.
type Keyspace struct {
	ns    int32
	label string
	err   error
}

// NewKeyspace returns the keyspace whose namespace is the first 4 bytes of
// the SHA-256 of name, read big-endian as a signed int32:
//
//	('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 8))::bit(32)::int4
//
// name follows the rules of StringKey. A bad name is reported by every key
// of the keyspace.
func NewKeyspace(name string) Keyspace {
	if err := checkName(ErrInvalidKey, "keyspace name", name); err != nil {
		return Keyspace{err: err}
	}
	return Keyspace{ns: hash32(name), label: name}
}

// KeyspaceID returns the keyspace with the explicit namespace id.
func KeyspaceID(id int32) Keyspace { return Keyspace{ns: id} }

// Namespace returns the keyspace's int32 namespace: the first half of every
// key in it.
func (ks Keyspace) Namespace() int32 { return ks.ns }

// Err reports why the keyspace is invalid, or nil.
func (ks Keyspace) Err() error { return ks.err }

// String returns the keyspace's name, or its namespace when it has none.
func (ks Keyspace) String() string {
	if ks.label != "" {
		return ks.label
	}
	return strconv.FormatInt(int64(ks.ns), 10)
}

// Key returns the pair key (namespace, h) where h is the first 4 bytes of the
// SHA-256 of name, read big-endian as a signed int32. In SQL:
//
//	pg_advisory_xact_lock(<namespace>,
//	    ('x' || left(encode(sha256(convert_to(name, 'UTF8')), 'hex'), 8))::bit(32)::int4)
//
// name follows the rules of StringKey.
func (ks Keyspace) Key(name string) Key {
	if ks.err != nil {
		return Key{err: ks.err}
	}
	if err := checkName(ErrInvalidKey, "key name", name); err != nil {
		return Key{err: err}
	}
	return Key{kind: kindPair, a: ks.ns, b: hash32(name), label: ks.prefix() + name, space: ks.label}
}

// ID returns the pair key (namespace, n), for resources that already have an
// int32 id.
func (ks Keyspace) ID(n int32) Key {
	if ks.err != nil {
		return Key{err: ks.err}
	}
	k := PairKey(ks.ns, n)
	if ks.label != "" {
		k.label = ks.prefix() + "#" + strconv.FormatInt(int64(n), 10)
		k.space = ks.label
	}
	return k
}

func (ks Keyspace) prefix() string {
	if ks.label == "" {
		return ""
	}
	return ks.label + "/"
}

// InvalidKey returns a Key that carries err, for packages that derive keys
// of their own (as interop does) and report bad input the way this
// package's constructors do: Err returns an error that matches both
// ErrInvalidKey and err, and every locking function returns it before
// touching the database. A nil err is reported as a caller's mistake.
func InvalidKey(err error) Key {
	if err == nil {
		err = errors.New("InvalidKey called with a nil error")
	}
	return Key{err: fmt.Errorf("%w: %w", ErrInvalidKey, err)}
}

// Err reports why the key is invalid, or nil. The error matches ErrInvalidKey.
func (k Key) Err() error {
	if k.err != nil {
		return k.err
	}
	if k.kind == kindNone {
		return fmt.Errorf("%w: the zero Key (build keys with StringKey, Int64Key, PairKey or a Keyspace)", ErrInvalidKey)
	}
	return nil
}

// Int64 returns the bigint of a bigint-space key; ok is false otherwise.
func (k Key) Int64() (n int64, ok bool) { return k.v, k.kind == kindInt64 }

// Pair returns the two halves of a pair-space key; ok is false otherwise.
func (k Key) Pair() (a, b int32, ok bool) { return k.a, k.b, k.kind == kindPair }

// Keyspace returns the name of the keyspace the key was made in
// (NewKeyspace(name).Key or .ID), or "" for any other key. Its values are as
// few as the service's keyspaces, so it suits a metric label where the key
// itself would not.
func (k Key) Keyspace() string { return k.space }

// Name returns the name the key was derived from, if any (for keyspace keys,
// "keyspace/name").
func (k Key) Name() string { return k.label }

// String returns a form for logs: the name (cut to at most 64 bytes, never
// inside a character) if there is one, then the PostgreSQL key, for example
// `"orders:42" bigint(-8476019149258318077)` or `"billing/inv-7" pair(211142636,1963379667)`.
func (k Key) String() string {
	var sb strings.Builder
	if k.label != "" {
		sb.WriteString(strconv.Quote(truncate(k.label)))
		sb.WriteByte(' ')
	}
	switch k.kind {
	case kindInt64:
		fmt.Fprintf(&sb, "bigint(%d)", k.v)
	case kindPair:
		fmt.Fprintf(&sb, "pair(%d,%d)", k.a, k.b)
	default:
		sb.WriteString("invalid")
	}
	return sb.String()
}

// KeyFromPgLocks decodes an advisory lock row of pg_locks back into a Key.
// Pass the classid, objid and objsubid columns; PostgreSQL shows classid and
// objid as unsigned oids:
//
//	SELECT classid, objid, objsubid FROM pg_locks
//	WHERE locktype = 'advisory'
//	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database());
//
// objsubid 1 is the bigint space (classid<<32 | objid); objsubid 2 the pair
// space (each half an int32). Any other objsubid is an error matching
// ErrInvalidKey.
func KeyFromPgLocks(classid, objid uint32, objsubid int) (Key, error) {
	switch objsubid {
	case 1:
		return Int64Key(int64(uint64(classid)<<32 | uint64(objid))), nil
	case 2:
		return PairKey(int32(classid), int32(objid)), nil
	}
	return Key{}, fmt.Errorf("%w: pg_locks objsubid %d is not an advisory lock key space (want 1 or 2)", ErrInvalidKey, objsubid)
}

// pgLocks returns the (classid, objid, objsubid) under which pg_locks shows k.
func (k Key) pgLocks() (classid, objid uint32, objsubid int) {
	if k.kind == kindPair {
		return uint32(k.a), uint32(k.b), 2
	}
	return uint32(uint64(k.v) >> 32), uint32(k.v), 1
}

// compareKeys orders keys canonically: bigint keys before pairs, then by value.
func compareKeys(x, y Key) int {
	if c := cmp.Compare(x.kind, y.kind); c != 0 {
		return c
	}
	if x.kind == kindInt64 {
		return cmp.Compare(x.v, y.v)
	}
	if c := cmp.Compare(x.a, y.a); c != 0 {
		return c
	}
	return cmp.Compare(x.b, y.b)
}

// checkName reports, wrapped around sentinel, what makes name unusable as a
// key name or an identifier (pgident.Problem). what names it in the message
// ("key name", "column name").
func checkName(sentinel error, what, name string) error {
	if p := pgident.Problem(what, name); p != "" {
		return fmt.Errorf("%w: %s", sentinel, p)
	}
	return nil
}

// truncate shortens s for a message: pgident.Truncate.
func truncate(s string) string { return pgident.Truncate(s) }

func hash32(name string) int32 {
	sum := sha256.Sum256([]byte(name))
	return int32(binary.BigEndian.Uint32(sum[:4]))
}
