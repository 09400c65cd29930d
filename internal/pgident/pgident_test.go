package pgident

import "testing"

func TestQuote(t *testing.T) {
	for _, tc := range []struct{ in, quoted, ifNeeded string }{
		{"plain", `"plain"`, "plain"},
		{"with_1", `"with_1"`, "with_1"},
		{"1digit", `"1digit"`, `"1digit"`},
		{"Upper", `"Upper"`, `"Upper"`},
		{`a"b`, `"a""b"`, `"a""b"`},
		{"", `""`, `""`},
		{"sp ace", `"sp ace"`, `"sp ace"`},
	} {
		if got := Quote(tc.in); got != tc.quoted {
			t.Errorf("Quote(%q) = %s, want %s", tc.in, got, tc.quoted)
		}
		if got := QuoteIfNeeded(tc.in); got != tc.ifNeeded {
			t.Errorf("QuoteIfNeeded(%q) = %s, want %s", tc.in, got, tc.ifNeeded)
		}
	}
}
