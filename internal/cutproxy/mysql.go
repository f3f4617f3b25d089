package cutproxy

import (
	"bytes"
	"fmt"
	"net"
)

// NewMySQL starts a proxy on a free loopback port in front of the MySQL or
// MariaDB server at addr (host:port), cutting connections at COMMIT as New's
// proxy does; clients reach it at Addr. It reads the client's side as MySQL
// packets (a 3-byte little-endian payload length, a sequence id, the
// payload), the handshake passing through unread: a COMMIT is a command (a
// packet with sequence id 0) that is a COM_QUERY of COMMIT, as
// go-sql-driver sends Tx.Commit. The client must ask for neither
// compression nor TLS, which would hide the packets. A server that is down
// when a client connects gets that client's connection closed at once.
func NewMySQL(addr string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("cutproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: addr, newStream: func() streamer { return &mysqlStream{} },
		open: map[net.Conn]struct{}{}, drains: map[chan struct{}]struct{}{}}
	p.wg.Go(p.serve)
	return p, nil
}

// mysqlStream follows one connection's client packets.
type mysqlStream struct {
	pending []byte // the start of a packet the next read completes
}

// comQuery is the command byte of COM_QUERY.
const comQuery = 0x03

// feed reads MySQL's packets (streamer); MySQL has no cancel request of
// the kind PostgreSQL's needs held back (KILL QUERY is a statement).
func (st *mysqlStream) feed(chunk []byte) (commit, cancel bool) {
	data := append(st.pending, chunk...)
	for len(data) >= 4 {
		n := 4 + (int(data[0]) | int(data[1])<<8 | int(data[2])<<16)
		if len(data) < n {
			break
		}
		if data[3] == 0 && isMySQLCommit(data[4:n]) {
			commit = true
		}
		data = data[n:]
	}
	st.pending = append(st.pending[:0], data...)
	return commit, false
}

// isMySQLCommit reports whether payload is a COM_QUERY whose text is COMMIT
// (any case, blanks or a semicolon around it).
func isMySQLCommit(payload []byte) bool {
	if len(payload) < 7 || payload[0] != comQuery {
		return false
	}
	text := bytes.TrimSpace(payload[1:])
	text = bytes.TrimSpace(bytes.TrimSuffix(text, []byte(";")))
	return bytes.EqualFold(text, []byte("COMMIT"))
}
