package cutproxy

import (
	"testing"

	"github.com/jackc/pgx/v5/pgproto3"
)

func encode(t *testing.T, msgs ...pgproto3.FrontendMessage) []byte {
	t.Helper()
	var buf []byte
	for _, m := range msgs {
		var err error
		if buf, err = m.Encode(buf); err != nil {
			t.Fatal(err)
		}
	}
	return buf
}

// TestStreamFindsCommits feeds the client side of a connection to the
// message reader, split at every byte boundary, and checks which chunks it
// takes for a COMMIT.
func TestStreamFindsCommits(t *testing.T) {
	startup := encode(t, &pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": "u"}})
	steps := []struct {
		name   string
		msg    []byte
		commit bool
	}{
		{"simple COMMIT", encode(t, &pgproto3.Query{String: "commit"}), true},
		{"simple other", encode(t, &pgproto3.Query{String: "select 1"}), false},
		{"exec-mode COMMIT", encode(t, &pgproto3.Parse{Query: "COMMIT"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Sync{}), true},
		{"exec-mode other", encode(t, &pgproto3.Parse{Query: "INSERT INTO t VALUES ($1)"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("commit")}}, &pgproto3.Execute{}, &pgproto3.Sync{}), false},
		{"prepare COMMIT", encode(t, &pgproto3.Parse{Name: "stmt_c", Query: "COMMIT"}, &pgproto3.Describe{ObjectType: 'S', Name: "stmt_c"}, &pgproto3.Sync{}), false},
		{"prepare other", encode(t, &pgproto3.Parse{Name: "stmt_u", Query: "UPDATE t SET a = 1"}, &pgproto3.Sync{}), false},
		{"prepared other", encode(t, &pgproto3.Bind{PreparedStatement: "stmt_u"}, &pgproto3.Execute{}, &pgproto3.Sync{}), false},
		{"prepared COMMIT after another", encode(t, &pgproto3.Bind{PreparedStatement: "stmt_u"}, &pgproto3.Execute{}, &pgproto3.Bind{PreparedStatement: "stmt_c"}, &pgproto3.Execute{}, &pgproto3.Sync{}), true},
	}
	// Whole messages, one chunk each.
	st := &stream{named: map[string]bool{}}
	if st.feed(startup) {
		t.Fatal("the startup message is no COMMIT")
	}
	for _, s := range steps {
		if got := st.feed(s.msg); got != s.commit {
			t.Errorf("%s: commit = %v, want %v", s.name, got, s.commit)
		}
	}
	// Every message split in two at each position: the COMMIT shows once,
	// in the chunk that completes its Bind or query.
	for _, s := range steps {
		for cut := 1; cut < len(s.msg); cut++ {
			st := &stream{named: map[string]bool{"stmt_c": true}}
			st.feed(startup)
			first, second := st.feed(s.msg[:cut]), st.feed(s.msg[cut:])
			if first && second || (first || second) != s.commit {
				t.Fatalf("%s split at %d: %v then %v, want one COMMIT: %v", s.name, cut, first, second, s.commit)
			}
		}
	}
}
