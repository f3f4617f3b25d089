// Package ident validates and quotes the names of idem's tables.
package ident

import (
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
)

var plain = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Plain reports whether name is a plain identifier of at most maxLen bytes:
// letters, digits and underscores, not starting with a digit.
func Plain(name string, maxLen int) bool {
	return len(name) <= maxLen && plain.MatchString(name)
}

// ValidateTable reports whether schema and table are acceptable names for
// one of idem's tables: plain identifiers, the table at most 48 bytes (so
// that the names derived from it for its indexes and version table fit
// PostgreSQL's 63), the schema at most 63. schema may be empty.
func ValidateTable(schema, table string) error {
	if !Plain(table, 48) {
		return fmt.Errorf("table name %q: want letters, digits and underscores, at most 48 bytes", table)
	}
	if schema != "" && !Plain(schema, 63) {
		return fmt.Errorf("schema name %q: want letters, digits and underscores, at most 63 bytes", schema)
	}
	return nil
}

// Qualified returns the quoted, possibly schema-qualified table name.
func Qualified(schema, table string) string {
	if schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{schema, table}.Sanitize()
}
