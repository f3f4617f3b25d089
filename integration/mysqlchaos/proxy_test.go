//go:build chaos

package mysqlchaos_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// commitProxy is a TCP proxy in front of a MySQL or MariaDB server that can
// cut a connection when the client sends COMMIT, so that the client cannot
// tell whether its transaction committed.
//
// It reads the client's side as MySQL packets (a 3-byte little-endian
// payload length, a sequence id, the payload) and forwards them unchanged,
// the handshake included; the server's side is copied as it comes. A
// command begins with sequence id 0, and COMMIT is a COM_QUERY (0x03)
// whose text is COMMIT: go-sql-driver sends Tx.Commit so. The driver must
// not be asked for compression or TLS, which would hide the packets.
//
// A cut closes the client's side first, so that no answer can reach the
// client however fast the server is. Then it forwards the COMMIT and lets
// the server answer (the copy of the server's side reads the answer, fails
// to pass it on and closes the server's side): the transaction committed.
// Or, with the drop rate, it closes the server's side instead of forwarding
// the COMMIT: the server rolls the transaction back. The client sees the
// same lost connection either way.
type commitProxy struct {
	ln     net.Listener
	target string
	rate   atomic.Uint64 // cut probability, in millionths
	drop   atomic.Uint64 // share of the cuts made before forwarding, in millionths
	cuts   atomic.Int64
	drops  atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
}

// newCommitProxy starts a proxy on a free loopback port in front of target
// (host:port).
func newCommitProxy(target string) (*commitProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("commit proxy: %w", err)
	}
	p := &commitProxy{ln: ln, target: target, open: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// Addr is the proxy's host:port.
func (p *commitProxy) Addr() string { return p.ln.Addr().String() }

// SetCutRate sets the probability (0..1) that a COMMIT is cut.
func (p *commitProxy) SetCutRate(f float64) { p.rate.Store(uint64(f * 1e6)) }

// SetDropRate sets the share (0..1) of the cuts made before forwarding the
// COMMIT.
func (p *commitProxy) SetDropRate(f float64) { p.drop.Store(uint64(f * 1e6)) }

// Cuts is the number of connections cut at COMMIT so far.
func (p *commitProxy) Cuts() int64 { return p.cuts.Load() }

// Drops is how many of the cuts did not forward the COMMIT.
func (p *commitProxy) Drops() int64 { return p.drops.Load() }

// Close stops accepting, closes every connection and waits for the
// proxy's goroutines.
func (p *commitProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	_ = p.ln.Close()
	p.wg.Wait()
}

// track registers c to be closed by Close; false when the proxy is closed.
func (p *commitProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *commitProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
}

func (p *commitProxy) serve() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		if !p.track(client) {
			_ = client.Close()
			return
		}
		p.wg.Go(func() { p.relay(client) })
	}
}

// relay joins client to a new connection to the server. While the server
// is down the client's connection is closed at once.
func (p *commitProxy) relay(client net.Conn) {
	defer p.untrack(client)
	defer client.Close()
	server, err := net.DialTimeout("tcp", p.target, 2*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		_ = server.Close()
		return
	}
	defer p.untrack(server)
	defer server.Close()

	var done sync.WaitGroup
	done.Go(func() {
		// The server's side: when the client's side is gone (a cut, or
		// the client hung up), the next write fails and the server's
		// connection is closed after the server answered.
		_, _ = io.Copy(client, server)
		_ = server.Close()
		_ = client.Close()
	})
	p.clientSide(client, server)
	done.Wait()
}

// clientSide forwards the client's packets to the server until either side
// ends, cutting at a COMMIT when the dice say so.
func (p *commitProxy) clientSide(client, server net.Conn) {
	r := bufio.NewReaderSize(client, 64<<10)
	var header [4]byte
	for {
		if _, err := io.ReadFull(r, header[:]); err != nil {
			_ = server.Close()
			return
		}
		n := int(header[0]) | int(header[1])<<8 | int(header[2])<<16
		packet := make([]byte, 4+n)
		copy(packet, header[:])
		if _, err := io.ReadFull(r, packet[4:]); err != nil {
			_ = server.Close()
			return
		}
		if header[3] == 0 && isCommit(packet[4:]) && p.roll(&p.rate) {
			p.cut(client, server, packet)
			return
		}
		if _, err := server.Write(packet); err != nil {
			_ = client.Close()
			return
		}
	}
}

// cut ends the client's connection at a COMMIT, and forwards the COMMIT or
// ends the server's connection instead.
func (p *commitProxy) cut(client, server net.Conn, commit []byte) {
	// Counted before the client can see the cut.
	drop := p.roll(&p.drop)
	p.cuts.Add(1)
	if drop {
		p.drops.Add(1)
	}
	_ = client.Close()
	if drop {
		_ = server.Close()
		return
	}
	// The server's side reads the answer and closes the connection; bound
	// the wait in case the server never answers.
	_ = server.SetReadDeadline(time.Now().Add(30 * time.Second))
	if _, err := server.Write(commit); err != nil {
		// The server's side was gone already: nothing was forwarded.
		p.drops.Add(1)
		_ = server.Close()
	}
}

// roll reports true with the probability in millionths that v holds.
func (p *commitProxy) roll(v *atomic.Uint64) bool {
	r := v.Load()
	return r > 0 && (r >= 1e6 || rand.Uint64N(1e6) < r)
}

// isCommit reports whether payload is a COM_QUERY whose text is COMMIT
// (any case, surrounded by blanks or followed by a semicolon).
func isCommit(payload []byte) bool {
	if len(payload) < 7 || payload[0] != 0x03 {
		return false
	}
	text := bytes.TrimSpace(payload[1:])
	text = bytes.TrimSpace(bytes.TrimSuffix(text, []byte(";")))
	return bytes.EqualFold(text, []byte("COMMIT"))
}
