package mysql

import (
	"strings"
	"sync"
)

// The protocol numbers its parameters ($1, $2, ...) and may use one more
// than once or not at all; MySQL binds ? by position. Bind rewrites a
// statement once (the rewrite is kept) and orders its arguments per call.

type binding struct {
	query string
	args  []int // the argument each ? takes, by index
}

var bindings sync.Map // protocol statement -> *binding

// Bind returns query with each $n as ?, and the arguments in the order the
// ?s take them. The protocol's statements hold no $ but in parameters.
func Bind(query string, args []any) (string, []any) {
	b, ok := bindings.Load(query)
	if !ok {
		b, _ = bindings.LoadOrStore(query, rewrite(query))
	}
	bd := b.(*binding)
	out := make([]any, len(bd.args))
	for i, n := range bd.args {
		if n < len(args) {
			out[i] = args[n]
		}
	}
	return bd.query, out
}

func rewrite(query string) *binding {
	var (
		b    strings.Builder
		args []int
	)
	for i := 0; i < len(query); i++ {
		c := query[i]
		if c != '$' || i+1 >= len(query) || query[i+1] < '0' || query[i+1] > '9' {
			b.WriteByte(c)
			continue
		}
		n := 0
		for i+1 < len(query) && query[i+1] >= '0' && query[i+1] <= '9' {
			i++
			n = n*10 + int(query[i]-'0')
		}
		b.WriteByte('?')
		args = append(args, n-1)
	}
	return &binding{query: b.String(), args: args}
}
