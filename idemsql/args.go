package idemsql

import "strings"

// convertArgs adapts arguments that some drivers cannot bind: a []string
// becomes a PostgreSQL array literal (NULL for a nil slice), which every
// driver sends as text and the server reads as text[] where the statement
// says so (`= ANY($2::text[])`). Other values pass unchanged. args itself is
// never modified.
func convertArgs(args []any) []any {
	var out []any
	for i, a := range args {
		ss, ok := a.([]string)
		if !ok {
			continue
		}
		if out == nil {
			out = append([]any(nil), args...)
		}
		if ss == nil {
			out[i] = nil
		} else {
			out[i] = textArray(ss)
		}
	}
	if out == nil {
		return args
	}
	return out
}

// textArray renders ss as a PostgreSQL array literal with every element
// quoted, so that commas, braces, spaces and the word NULL stay text.
func textArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for _, r := range s {
			if r == '"' || r == '\\' {
				b.WriteByte('\\')
			}
			b.WriteRune(r)
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
