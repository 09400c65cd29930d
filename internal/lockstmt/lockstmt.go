// Package lockstmt hands the library's lock statement to the repository's
// own programs. It exists only for them; it is not part of txlock's API.
package lockstmt

import "time"

// Exclusive returns the statement WithLock sends, in its own transaction, to
// try the exclusive lock of txlock.Int64Key(key). Package txlock sets it at
// init to its own builder of that statement, so that a program can send the
// library's statement by hand (cmd/txlock-bench measures it without the
// client-side work around it). It is nil until package txlock is imported.
var Exclusive func(key int64) string

// Begin returns the query of pgxlock's polling attempt for
// txlock.Int64Key(key), with WithMaxHold(maxHold) if maxHold > 0: the lock
// statement, then BEGIN. Package txlock sets it at init, like Exclusive, so
// that a benchmark can send it by hand.
var Begin func(key int64, maxHold time.Duration) string
