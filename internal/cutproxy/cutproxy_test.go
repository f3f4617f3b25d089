package cutproxy

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
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

// instantServer is a PostgreSQL server that answers every simple query the
// moment it arrives, the fastest a server can be. It accepts any startup,
// and when a connection ends it sends the queries that connection carried
// on sessions.
type instantServer struct {
	ln       net.Listener
	sessions chan []string
}

func newInstantServer(t *testing.T) *instantServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &instantServer{ln: ln, sessions: make(chan []string, 1000)}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { s.serve(c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
	})
	return s
}

// url is the server's connection string.
func (s *instantServer) url() string {
	return "postgres://u@" + s.ln.Addr().String() + "/db?sslmode=disable"
}

func (s *instantServer) serve(c net.Conn) {
	defer c.Close()
	b := pgproto3.NewBackend(c, c)
	if m, err := b.ReceiveStartupMessage(); err != nil {
		return
	} else if _, ok := m.(*pgproto3.StartupMessage); !ok {
		return // a cancel request (pgconn sends one for a broken query): no session
	}
	var queries []string
	defer func() { s.sessions <- queries }()
	b.Send(&pgproto3.AuthenticationOk{})
	b.Send(&pgproto3.BackendKeyData{ProcessID: 1, SecretKey: []byte{1, 2, 3, 4}})
	b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
	if b.Flush() != nil {
		return
	}
	for {
		msg, err := b.Receive()
		if err != nil {
			return
		}
		q, ok := msg.(*pgproto3.Query)
		if !ok {
			continue
		}
		queries = append(queries, q.String)
		b.Send(&pgproto3.CommandComplete{CommandTag: []byte(strings.Fields(q.String)[0])})
		b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if b.Flush() != nil {
			return
		}
	}
}

// TestCutCommitIsNeverAnswered cuts COMMITs in front of a server that
// answers at once: the client never gets the answer, whether the COMMIT
// reached the server (forwarded, then cut) or not (dropped), and a query
// before it on the same connection is relayed as usual.
func TestCutCommitIsNeverAnswered(t *testing.T) {
	srv := newInstantServer(t)
	p, err := New(srv.url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	p.SetCutRate(1)
	ctx := context.Background()
	const rounds = 200
	for i := range rounds {
		dropped := i%4 == 3
		p.SetDropRate(map[bool]float64{false: 0, true: 1}[dropped])
		conn, err := pgconn.Connect(ctx, p.URL())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "SELECT 1").ReadAll(); err != nil {
			t.Fatalf("round %d: a query before the COMMIT: %v", i, err)
		}
		_, err = conn.Exec(ctx, "COMMIT").ReadAll()
		conn.Close(ctx)
		if err == nil {
			t.Fatalf("round %d (dropped %v): the cut COMMIT was answered", i, dropped)
		}
		var got []string
		select {
		case got = <-srv.sessions:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the server's connection did not end", i)
		}
		want := []string{"SELECT 1", "COMMIT"}
		if dropped {
			want = want[:1]
		}
		if !slices.Equal(got, want) {
			t.Fatalf("round %d (dropped %v): the server received %q, want %q", i, dropped, got, want)
		}
	}
	if p.Cuts() != rounds || p.Drops() != rounds/4 {
		t.Fatalf("cuts %d, drops %d; want %d, %d", p.Cuts(), p.Drops(), rounds, rounds/4)
	}
}
