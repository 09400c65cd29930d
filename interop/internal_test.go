package interop

import "testing"

// TestJavaHashCode checks javaHashCode against values of Java's
// String.hashCode that its definition gives, s[0]*31^(n-1) + … + s[n-1]
// over UTF-16 code units in int arithmetic: the well-known "hello"
// (99162322), the colliding "Aa" and "BB" (2112), and a character outside
// the BMP, U+1F600, whose surrogates are 0xD83D and 0xDE00: 0xD83D*31 +
// 0xDE00 = 1772899 (hashing the code point 0x1F600 instead would give
// 128512).
func TestJavaHashCode(t *testing.T) {
	for s, want := range map[string]int32{
		"":      0,
		"hello": 99162322,
		"Aa":    2112,
		"BB":    2112,
		"😀":     1772899,
	} {
		if got := javaHashCode(s); got != want {
			t.Errorf("javaHashCode(%q) = %d, want %d", s, got, want)
		}
	}
}
