package cutproxy

import "testing"

// mysqlPacket is payload as a MySQL packet with sequence id seq.
func mysqlPacket(seq byte, payload string) []byte {
	n := len(payload)
	return append([]byte{byte(n), byte(n >> 8), byte(n >> 16), seq}, payload...)
}

// The MySQL stream finds a COM_QUERY of COMMIT, a command's first packet,
// whole or split across reads at any byte, and nothing else.
func TestMySQLStreamFindsCommit(t *testing.T) {
	steps := []struct {
		name   string
		msg    []byte
		commit bool
	}{
		{"handshake response", mysqlPacket(1, "\x8d\xa6\x0f\x00COMMIT"), false},
		{"COMMIT", mysqlPacket(0, "\x03COMMIT"), true},
		{"commit; in lower case", mysqlPacket(0, "\x03 commit; "), true},
		{"a query mentioning commit", mysqlPacket(0, "\x03INSERT INTO t VALUES ('COMMIT')"), false},
		{"a prepared COMMIT", mysqlPacket(0, "\x16COMMIT"), false},
		{"COMMIT after another", append(mysqlPacket(0, "\x03SELECT 1"), mysqlPacket(0, "\x03COMMIT")...), true},
		{"ROLLBACK", mysqlPacket(0, "\x03ROLLBACK"), false},
		{"COMMIT AND CHAIN", mysqlPacket(0, "\x03COMMIT AND CHAIN"), false},
		{"a bare COM_QUERY", mysqlPacket(0, "\x03"), false},
	}
	st := &mysqlStream{}
	for _, s := range steps {
		if got, cancel := st.feed(s.msg); got != s.commit || cancel {
			t.Errorf("%s: commit = %v (cancel %v), want %v", s.name, got, cancel, s.commit)
		}
	}
	for _, s := range steps {
		for cut := 1; cut < len(s.msg); cut++ {
			st := &mysqlStream{}
			first, _ := st.feed(s.msg[:cut])
			second, _ := st.feed(s.msg[cut:])
			if first && second || (first || second) != s.commit {
				t.Fatalf("%s split at %d: %v then %v, want one COMMIT: %v", s.name, cut, first, second, s.commit)
			}
		}
	}
}
