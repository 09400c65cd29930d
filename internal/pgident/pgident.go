// Package pgident holds the rules for PostgreSQL names that the library,
// package interop and the txlock command share: quoting identifiers, what
// makes a name unusable as PostgreSQL text, and how a name is shortened in
// a message.
package pgident

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Quote quotes s as a PostgreSQL identifier: in double quotes, with each
// double quote doubled. It does not check s; callers that take names from
// users check them first (empty, NUL, longer than 63 bytes).
func Quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// QuoteIfNeeded returns s as it is when it is a plain lower-case
// identifier (letters, digits and underscores, not starting with a digit),
// and Quote(s) otherwise: for text shown to people, where the quotes of a
// plain name are noise.
func QuoteIfNeeded(s string) string {
	plain := s != ""
	for i, r := range s {
		if !(r == '_' || 'a' <= r && r <= 'z' || i > 0 && '0' <= r && r <= '9') {
			plain = false
		}
	}
	if plain {
		return s
	}
	return Quote(s)
}

// Problem says what makes name, named what in the message ("key name"),
// unusable as PostgreSQL text, which can neither be invalid UTF-8 nor hold
// a NUL byte: it is empty, not valid UTF-8, or holds a NUL byte. It is ""
// when none of these is so.
func Problem(what, name string) string {
	switch {
	case name == "":
		return what + " is empty"
	case !utf8.ValidString(name):
		return fmt.Sprintf("%s %q is not valid UTF-8", what, Truncate(name))
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Sprintf("%s %q contains a NUL byte, which PostgreSQL text cannot hold", what, Truncate(name))
	}
	return ""
}

// maxShown is how many bytes of a name Truncate keeps.
const maxShown = 64

// Truncate shortens s, for a message or a log, to at most maxShown bytes
// followed by "…". It never cuts inside a UTF-8 character: it backs up to
// the start of the character that byte maxShown belongs to, at most
// utf8.UTFMax-1 bytes (further back there is no such character, only bytes
// that are not UTF-8, which are kept as they are).
func Truncate(s string) string {
	if len(s) <= maxShown {
		return s
	}
	cut := maxShown
	for i := maxShown; i > maxShown-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			cut = i
			break
		}
	}
	return s[:cut] + "…"
}
