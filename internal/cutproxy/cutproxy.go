// Package cutproxy is a TCP proxy in front of PostgreSQL that can cut a
// connection when the client sends COMMIT, before any answer comes back: the
// client cannot tell whether its transaction committed. A cut ends the
// client's side first, so that no answer can reach it however fast the
// server is, then forwards the COMMIT and ends the server's side after it
// (the transaction commits) or, with SetDropRate, ends the server's side
// instead of forwarding it (the server rolls it back), so that both outcomes
// hide behind the same error. A client that loses its connection may send a
// cancel request for it (pgx does): the proxy holds cancel requests back
// until the sessions cut after a forwarded COMMIT have ended, so that a
// cancel never turns that COMMIT into a rollback.
//
// The integration tests, the chaos soaks and the bench's fault suites use
// it (NewMySQL for MySQL and MariaDB); it is never part of the library.
// It reads the client's protocol messages: a COMMIT is a
// simple query that contains one, or a Bind of a statement whose Parse
// carried one (unnamed, in the same batch, as pgx's QueryExecModeExec sends
// it, or named earlier, as pgx's default mode and idem's prepared statements
// do). Preparing a COMMIT is not committing, so a Parse alone is never cut.
package cutproxy

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Proxy forwards connections to one PostgreSQL server. The zero value is not
// usable; call New.
type Proxy struct {
	ln  net.Listener
	cfg *pgconn.Config // New's; nil for NewMySQL's
	// target is NewMySQL's server (host:port), and newStream what reads
	// each connection's client messages.
	target    string
	newStream func() streamer
	rate      atomic.Uint64 // cut probability, in millionths
	drop      atomic.Uint64 // share of the cuts made before forwarding, in millionths
	cuts      atomic.Int64
	drops     atomic.Int64
	wg        sync.WaitGroup
	mu        sync.Mutex
	open      map[net.Conn]struct{}
	closed    bool
	// drains holds a channel per session cut after a forwarded COMMIT,
	// closed when the server has ended that session.
	drains map[chan struct{}]struct{}
}

// New starts a proxy on a free loopback port in front of the server that
// databaseURL names.
func New(databaseURL string) (*Proxy, error) {
	cfg, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("cutproxy: parsing the database URL: %w", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cutproxy: %w", err)
	}
	p := &Proxy{ln: ln, cfg: cfg, newStream: func() streamer { return &stream{named: map[string]bool{}} },
		open: map[net.Conn]struct{}{}, drains: map[chan struct{}]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// streamer follows one connection's client messages.
type streamer interface {
	// feed reads the complete messages in chunk (with what an earlier
	// chunk left) and reports whether one of them executes a COMMIT, and
	// whether one is a cancel request.
	feed(chunk []byte) (commit, cancel bool)
}

// URL is databaseURL's connection string pointed at the proxy (New's; ""
// for a proxy NewMySQL made, which is reached at Addr).
func (p *Proxy) URL() string {
	if p.cfg == nil {
		return ""
	}
	u := url.URL{Scheme: "postgres", Host: p.ln.Addr().String(), Path: "/" + p.cfg.Database, RawQuery: "sslmode=disable"}
	if p.cfg.Password != "" {
		u.User = url.UserPassword(p.cfg.User, p.cfg.Password)
	} else {
		u.User = url.User(p.cfg.User)
	}
	return u.String()
}

// SetCutRate sets the probability, from 0 to 1, that a client message
// carrying COMMIT is the last one forwarded on its connection.
func (p *Proxy) SetCutRate(rate float64) {
	rate = min(max(rate, 0), 1)
	p.rate.Store(uint64(rate * 1e6))
}

// SetDropRate sets the share, from 0 to 1, of the cuts made instead of
// forwarding the COMMIT: the server then sees the connection end inside the
// transaction and rolls it back. The default 0 forwards every COMMIT first.
func (p *Proxy) SetDropRate(rate float64) {
	rate = min(max(rate, 0), 1)
	p.drop.Store(uint64(rate * 1e6))
}

// Addr is the proxy's listening address, host:port on the loopback.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Cuts is how many connections the proxy cut at a COMMIT, forwarded or not.
func (p *Proxy) Cuts() int64 { return p.cuts.Load() }

// Drops is how many of the cuts did not forward the COMMIT.
func (p *Proxy) Drops() int64 { return p.drops.Load() }

// Close stops accepting, closes every forwarded connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.open {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

func (p *Proxy) dial() (net.Conn, error) {
	if p.target != "" {
		return net.DialTimeout("tcp", p.target, 2*time.Second)
	}
	if strings.HasPrefix(p.cfg.Host, "/") {
		return net.Dial("unix", fmt.Sprintf("%s/.s.PGSQL.%d", p.cfg.Host, p.cfg.Port))
	}
	return net.Dial("tcp", net.JoinHostPort(p.cfg.Host, fmt.Sprint(p.cfg.Port)))
}

// track registers c so that Close can end it; it reports false once the
// proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
	c.Close()
}

func (p *Proxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := p.dial()
		if err != nil {
			client.Close()
			continue
		}
		if !p.track(client) || !p.track(server) {
			client.Close()
			server.Close()
			return
		}
		l := &link{client: client, server: server}
		p.wg.Go(func() { p.relay(l) })
		p.wg.Go(func() { p.forward(l) })
	}
}

// link is what the two goroutines of one forwarded connection share.
type link struct {
	client, server net.Conn
	cut            atomic.Bool // the client's side was cut at a COMMIT

	mu      sync.Mutex
	relayed bool          // relay has returned: the server's side ended
	drain   chan struct{} // a forwarded cut's, closed when relay returns
}

// relay copies the server's replies to the client until either side ends.
// After a cut (the client's side is closed) it reads the server's replies
// and discards them until the server ends the connection, so that the
// COMMIT forwarded last is executed rather than lost to a reset.
func (p *Proxy) relay(l *link) {
	defer func() {
		p.untrack(l.client)
		p.untrack(l.server)
		l.mu.Lock()
		l.relayed = true
		drain := l.drain
		l.mu.Unlock()
		if drain != nil {
			p.endDrain(drain)
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := l.server.Read(buf)
		if n > 0 && !l.cut.Load() {
			if _, werr := l.client.Write(buf[:n]); werr != nil && !l.cut.Load() {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// cutDrainTimeout bounds how long, after a cut, the proxy waits for the
// server to end a connection it sent the COMMIT and end-of-file on, and how
// long a cancel request waits for such connections.
const cutDrainTimeout = 30 * time.Second

// forward copies the client's messages to the server until either side ends
// or a COMMIT is chosen to be the last message. A cut closes the client's
// side first, so that no reply can reach the client, then forwards the
// chunk carrying the COMMIT (unless it is dropped) and ends the server's
// side: after the COMMIT when it was forwarded, in its place when not.
func (p *Proxy) forward(l *link) {
	buf := make([]byte, 64<<10)
	st := p.newStream()
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			cutHere, drop := false, false
			commit, cancel := st.feed(buf[:n])
			if commit {
				cutHere, drop = p.cut()
			}
			if cancel {
				// A cancel request: it waits until the sessions cut after a
				// forwarded COMMIT have ended.
				p.awaitDrains()
			}
			if cutHere {
				if !drop {
					// Registered before the client can see the cut and send
					// a cancel request, which then waits for it.
					l.mu.Lock()
					if !l.relayed {
						l.drain = p.startDrain()
					}
					l.mu.Unlock()
				}
				l.cut.Store(true)
				p.untrack(l.client)
				if drop {
					p.untrack(l.server) // the COMMIT never reaches the server: it rolls back
					return
				}
				if _, werr := l.server.Write(buf[:n]); werr != nil {
					p.untrack(l.server)
					return
				}
				// End-of-file after the COMMIT: the server executes it,
				// answers into relay's discard, and ends the session.
				_ = l.server.SetReadDeadline(time.Now().Add(cutDrainTimeout))
				if cw, ok := l.server.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
					p.untrack(l.server)
				}
				return
			}
			if _, werr := l.server.Write(buf[:n]); werr != nil {
				break
			}
		}
		if err != nil {
			break
		}
	}
	p.untrack(l.client)
	p.untrack(l.server)
}

// startDrain registers a session cut after a forwarded COMMIT; endDrain,
// with what it returned, marks it ended.
func (p *Proxy) startDrain() chan struct{} {
	done := make(chan struct{})
	p.mu.Lock()
	p.drains[done] = struct{}{}
	p.mu.Unlock()
	return done
}

func (p *Proxy) endDrain(done chan struct{}) {
	p.mu.Lock()
	delete(p.drains, done)
	p.mu.Unlock()
	close(done)
}

// awaitDrains waits, for up to cutDrainTimeout, until the sessions cut
// after a forwarded COMMIT so far have ended.
func (p *Proxy) awaitDrains() {
	p.mu.Lock()
	pending := make([]chan struct{}, 0, len(p.drains))
	for d := range p.drains {
		pending = append(pending, d)
	}
	p.mu.Unlock()
	timeout := time.NewTimer(cutDrainTimeout)
	defer timeout.Stop()
	for _, d := range pending {
		select {
		case <-d:
		case <-timeout.C:
			return
		}
	}
}

// cut decides whether a chunk carrying a COMMIT ends its connection, and if
// so whether it is dropped rather than forwarded first.
func (p *Proxy) cut() (cut, drop bool) {
	rate := p.rate.Load()
	if rate == 0 {
		return false, false
	}
	if rate < 1e6 && rand.Uint64N(1e6) >= rate {
		return false, false
	}
	p.cuts.Add(1)
	if d := p.drop.Load(); d > 0 && rand.Uint64N(1e6) < d {
		p.drops.Add(1)
		return true, true
	}
	return true, false
}

// stream follows one connection's client messages.
type stream struct {
	pending    []byte          // the start of a message the next read completes
	started    bool            // the startup message has passed
	cancel     bool            // a cancel request was read (and not yet forwarded)
	named      map[string]bool // prepared statements that are a COMMIT
	unnamedCmt bool            // the unnamed statement is a COMMIT
}

// protocolMajor3 is the major version in a startup message (3.0, 3.2, ...);
// the other untyped requests (SSL, GSS encryption, cancel) carry 1234 there
// and come before it or alone. cancelRequestCode is a cancel request's.
const (
	protocolMajor3    = 3
	cancelRequestCode = 1234<<16 | 5678
)

// feed reads PostgreSQL's messages (streamer).
func (st *stream) feed(chunk []byte) (commit, cancel bool) {
	data := append(st.pending, chunk...)
	for {
		if !st.started {
			if len(data) < 8 {
				break
			}
			n := int(binary.BigEndian.Uint32(data))
			if n < 8 || len(data) < n {
				break
			}
			code := binary.BigEndian.Uint32(data[4:])
			st.started = code>>16 == protocolMajor3
			st.cancel = st.cancel || code == cancelRequestCode
			data = data[n:]
			continue
		}
		if len(data) < 5 {
			break
		}
		n := 1 + int(binary.BigEndian.Uint32(data[1:]))
		if n < 5 || len(data) < n {
			break
		}
		if st.message(data[0], data[5:n]) {
			commit = true
		}
		data = data[n:]
	}
	st.pending = append(st.pending[:0], data...)
	cancel, st.cancel = st.cancel, false
	return commit, cancel
}

// message looks at one typed message and reports whether it executes a
// COMMIT.
func (st *stream) message(typ byte, body []byte) bool {
	switch typ {
	case 'Q': // simple query
		return isCommit(cstring(body))
	case 'P': // Parse: name, query, ...
		name := cstring(body)
		query := cstring(body[min(len(name)+1, len(body)):])
		if name == "" {
			st.unnamedCmt = isCommit(query)
		} else if isCommit(query) {
			st.named[name] = true
		}
	case 'B': // Bind: portal, statement, ...
		portal := cstring(body)
		stmt := cstring(body[min(len(portal)+1, len(body)):])
		if stmt == "" {
			return st.unnamedCmt
		}
		return st.named[stmt]
	}
	return false
}

func isCommit(query string) bool {
	return strings.Contains(strings.ToUpper(query), "COMMIT")
}

// cstring is b up to its first NUL.
func cstring(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return string(b[:i])
	}
	return string(b)
}
