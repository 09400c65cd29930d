package txlock

import (
	"fmt"
	"strings"

	"github.com/txlock/txlock/internal/pgident"
)

// quoteIdent quotes name as a PostgreSQL identifier. It refuses names that
// are empty, not UTF-8, hold a NUL byte, or exceed PostgreSQL's 63 bytes
// (which the server would silently truncate to another name).
func quoteIdent(what, name string) (string, error) {
	if err := checkName(ErrInvalidArgument, what+" name", name); err != nil {
		return "", err
	}
	if len(name) > 63 {
		return "", fmt.Errorf("%w: %s name %q is longer than PostgreSQL's 63 bytes", ErrInvalidArgument, what, truncate(name))
	}
	return pgident.Quote(name), nil
}

// qualified quotes name, and schema if there is one, as "schema"."name".
func qualified(what, schema, name string) (string, error) {
	n, err := quoteIdent(what, name)
	if err != nil {
		return "", err
	}
	if schema == "" {
		return n, nil
	}
	s, err := quoteIdent(what+" schema", schema)
	if err != nil {
		return "", err
	}
	return s + "." + n, nil
}

// quoteLiteral quotes s as an escape string literal (E'…'), which reads the
// same whatever standard_conforming_strings says. A dollar sign is written
// as its escape, \x24, so that the literal can stand inside a dollar-quoted
// body such as a DO block's ($txlock$…$txlock$) without ending it.
func quoteLiteral(s string) string {
	return "E'" + literalEscapes.Replace(s) + "'"
}

var literalEscapes = strings.NewReplacer(`\`, `\\`, "'", "''", "$", `\x24`)
