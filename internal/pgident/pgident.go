// Package pgident quotes PostgreSQL identifiers: the one rule the library,
// package interop and the txlock command share.
package pgident

import "strings"

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
