package interop

import (
	"math/bits"

	"github.com/txlock/txlock"
)

// Hashtext returns what PostgreSQL's hashtext(s) returns on a little-endian
// server, for a database whose encoding is UTF8 and a deterministic
// collation (every collation but a nondeterministic ICU one): hash_bytes of
// the UTF-8 bytes of s, read as a signed int32. hash_bytes is Bob Jenkins'
// lookup3 hash as PostgreSQL adapted it (src/common/hashfn.c, hash_bytes,
// which hashtext of src/backend/access/hash/hashfunc.c calls through
// hash_any when the collation is deterministic).
// It is not a stable contract of PostgreSQL: a big-endian server returns
// other values, and the function may change in a future major version.
// The tests compare it with the server's hashtext on every version of the
// test matrix.
func Hashtext(s string) int32 {
	return int32(hashBytes(s))
}

// hashBytes is hash_bytes of src/common/hashfn.c on a little-endian machine.
// Its aligned and unaligned paths give the same result there: both read the
// key as little-endian 32-bit words, and the last 1 to 11 bytes into the low
// bytes of a, then b, then c, leaving c's lowest byte alone.
func hashBytes(k string) uint32 {
	n := len(k)
	a := 0x9e3779b9 + uint32(n) + 3923095
	b, c := a, a
	for len(k) >= 12 {
		a += le32(k[0:4])
		b += le32(k[4:8])
		c += le32(k[8:12])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// The last 0 to 11 bytes: bytes 0-3 into a, 4-7 into b, 8-10 into the
	// upper three bytes of c.
	for i := 0; i < len(k); i++ {
		v := uint32(k[i])
		switch {
		case i < 4:
			a += v << (8 * i)
		case i < 8:
			b += v << (8 * (i - 4))
		default:
			c += v << (8 * (i - 7))
		}
	}
	_, _, c = final(a, b, c)
	return c
}

func le32(s string) uint32 {
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}

// HashtextKey returns the bigint key of pg_advisory_xact_lock(hashtext(name)),
// the int4 sign-extended, as services that lock with
// pg_try_advisory_xact_lock(hashtext(?)) take it: PostgreSQL casts
// hashtext's int4 to bigint, so the key is in the bigint space (pg_locks
// objsubid 1), and a negative hash shows classid 4294967295. That statement
// takes a transaction lock, as txlock does. The key is Hashtext's, with its
// limits; the tests take the lock with that statement on the server and
// find this key in pg_locks.
//
// name is PostgreSQL text: one that is not valid UTF-8 or holds a NUL byte
// gives a Key carrying the error. The empty name is valid.
func HashtextKey(name string) txlock.Key {
	if bad(name, true) {
		return invalid("HashtextKey name", name)
	}
	return txlock.Int64Key(int64(Hashtext(name)))
}
