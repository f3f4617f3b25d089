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
	if c, _ := st.feed(startup); c {
		t.Fatal("the startup message is no COMMIT")
	}
	for _, s := range steps {
		if got, _ := st.feed(s.msg); got != s.commit {
			t.Errorf("%s: commit = %v, want %v", s.name, got, s.commit)
		}
	}
	// Every message split in two at each position: the COMMIT shows once,
	// in the chunk that completes its Bind or query.
	for _, s := range steps {
		for cut := 1; cut < len(s.msg); cut++ {
			st := &stream{named: map[string]bool{"stmt_c": true}}
			st.feed(startup)
			first, _ := st.feed(s.msg[:cut])
			second, _ := st.feed(s.msg[cut:])
			if first && second || (first || second) != s.commit {
				t.Fatalf("%s split at %d: %v then %v, want one COMMIT: %v", s.name, cut, first, second, s.commit)
			}
		}
	}
}

// fakeServer is a PostgreSQL server that answers every simple query the
// moment it arrives (a COMMIT after commitDelay), the fastest a server can
// be. It accepts any startup, gives each session a process ID of its own,
// and when a session ends it sends the queries it carried on sessions. It
// counts the cancel requests it receives, and those that came for a session
// still open.
type fakeServer struct {
	ln          net.Listener
	commitDelay time.Duration
	sessions    chan []string

	mu      sync.Mutex
	nextPID uint32
	open    map[uint32]bool // the sessions not yet ended, by process ID
	cancels int
	early   int // cancel requests for a session still open
}

func newFakeServer(t *testing.T, commitDelay time.Duration) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fakeServer{ln: ln, commitDelay: commitDelay, sessions: make(chan []string, 1000), open: map[uint32]bool{}}
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
func (s *fakeServer) url() string {
	return "postgres://u@" + s.ln.Addr().String() + "/db?sslmode=disable"
}

func (s *fakeServer) serve(c net.Conn) {
	defer c.Close()
	b := pgproto3.NewBackend(c, c)
	m, err := b.ReceiveStartupMessage()
	if err != nil {
		return
	}
	if cr, ok := m.(*pgproto3.CancelRequest); ok {
		s.mu.Lock()
		s.cancels++
		if s.open[cr.ProcessID] {
			s.early++
		}
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	s.nextPID++
	pid := s.nextPID
	s.open[pid] = true
	s.mu.Unlock()
	var queries []string
	defer func() {
		s.mu.Lock()
		delete(s.open, pid) // ended before the connection closes
		s.mu.Unlock()
		c.Close()
		s.sessions <- queries
	}()
	b.Send(&pgproto3.AuthenticationOk{})
	b.Send(&pgproto3.BackendKeyData{ProcessID: pid, SecretKey: []byte{1, 2, 3, 4}})
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
		if q.String == "COMMIT" {
			time.Sleep(s.commitDelay) // the server is still committing
		}
		b.Send(&pgproto3.CommandComplete{CommandTag: []byte(strings.Fields(q.String)[0])})
		b.Send(&pgproto3.ReadyForQuery{TxStatus: 'I'})
		if b.Flush() != nil {
			return
		}
	}
}

// cuttingEveryCommit is a proxy in front of srv that cuts every COMMIT,
// closed when the test ends.
func cuttingEveryCommit(t *testing.T, srv *fakeServer) *Proxy {
	t.Helper()
	p, err := New(srv.url())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	p.SetCutRate(1)
	return p
}

// TestCutCommitIsNeverAnswered cuts COMMITs in front of a server that
// answers at once: the client never gets the answer, whether the COMMIT
// reached the server (forwarded, then cut) or not (dropped), and a query
// before it on the same connection is relayed as usual.
func TestCutCommitIsNeverAnswered(t *testing.T) {
	srv := newFakeServer(t, 0)
	p := cuttingEveryCommit(t, srv)
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

// A client that lost its connection at a forwarded COMMIT sends a cancel
// request for it (pgconn does so itself, and here once more by hand): the
// proxy passes it on only once the server ended the session, so that it
// cannot cancel the COMMIT the server is still running.
func TestCancelWaitsForTheCutCommit(t *testing.T) {
	srv := newFakeServer(t, 20*time.Millisecond)
	p := cuttingEveryCommit(t, srv)
	ctx := context.Background()
	const rounds = 20
	for i := range rounds {
		conn, err := pgconn.Connect(ctx, p.URL())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "COMMIT").ReadAll(); err == nil {
			t.Fatalf("round %d: the cut COMMIT was answered", i)
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err = conn.CancelRequest(cctx)
		cancel()
		if err != nil {
			t.Fatalf("round %d: the cancel request: %v", i, err)
		}
		conn.Close(ctx)
		select {
		case got := <-srv.sessions:
			if !slices.Equal(got, []string{"COMMIT"}) {
				t.Fatalf("round %d: the server received %q", i, got)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: the server's connection did not end", i)
		}
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if srv.cancels < rounds || srv.early != 0 {
		t.Fatalf("%d cancel requests, %d of them while their session ran; want at least %d, none early", srv.cancels, srv.early, rounds)
	}
}
