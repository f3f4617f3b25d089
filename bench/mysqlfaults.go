package main

import (
	"context"
	"database/sql"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// mysqlCutProxy is a TCP proxy in front of a MySQL server that cuts a share
// of the connections whose client sends COMMIT: it closes the client's side
// first, so that no answer can reach the client, then forwards the COMMIT,
// and closes the server's side once the server has answered it. The
// transaction commits, and the client cannot tell. It reads the client's
// packets (a 3-byte length and a sequence number before each payload); a
// COMMIT is a COM_QUERY of that text, which is how database/sql's
// Tx.Commit reaches go-sql-driver. Neither TLS nor compression is
// understood: the DSN must use neither.
type mysqlCutProxy struct {
	ln     net.Listener
	target string
	rate   float64
	cuts   atomic.Int64
	wg     sync.WaitGroup
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	closed bool
}

// newMySQLCutProxy starts a proxy on a free loopback port in front of the
// server at target, cutting a share rate of the COMMITs.
func newMySQLCutProxy(target string, rate float64) (*mysqlCutProxy, error) {
	if rate < 0 || rate > 1 {
		return nil, fmt.Errorf("mysql cut proxy: the cut rate must lie in [0, 1], got %v", rate)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &mysqlCutProxy{ln: ln, target: target, rate: rate, open: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the proxy's address.
func (p *mysqlCutProxy) Addr() string { return p.ln.Addr().String() }

// Cuts is the number of COMMITs cut so far.
func (p *mysqlCutProxy) Cuts() int64 { return p.cuts.Load() }

// Close stops the proxy and ends every connection through it.
func (p *mysqlCutProxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.open {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}

// track registers c to close with the proxy; false once it is closed.
func (p *mysqlCutProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		_ = c.Close()
		return false
	}
	p.open[c] = struct{}{}
	return true
}

func (p *mysqlCutProxy) untrack(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
}

func (p *mysqlCutProxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(client) })
	}
}

// comQuery is the command byte of a text query.
const comQuery = 0x03

// isCommit reports whether a client packet's payload is a COMMIT.
func isCommit(payload []byte) bool {
	return len(payload) > 1 && payload[0] == comQuery && strings.EqualFold(strings.TrimSpace(string(payload[1:])), "COMMIT")
}

func (p *mysqlCutProxy) serve(client net.Conn) {
	if !p.track(client) {
		return
	}
	defer p.untrack(client)
	server, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		return
	}
	if !p.track(server) {
		return
	}
	// The server's answers go to the client until either side ends; after
	// a cut, the write of the COMMIT's answer to the closed client fails,
	// and the server's side closes then: after the commit.
	var answers sync.WaitGroup
	answers.Go(func() {
		_, _ = io.Copy(client, server)
		p.untrack(server)
	})
	defer answers.Wait()
	buf := make([]byte, 4, 4+4096)
	for {
		buf = buf[:4]
		if _, err := io.ReadFull(client, buf); err != nil {
			break
		}
		n := int(binary.LittleEndian.Uint32(append(buf[:3:3], 0)))
		buf = append(buf, make([]byte, n)...)
		if _, err := io.ReadFull(client, buf[4:]); err != nil {
			break
		}
		if isCommit(buf[4:]) && rand.Float64() < p.rate {
			p.cuts.Add(1)
			_ = client.Close()
			_, _ = server.Write(buf)
			// The server's answer ends the copy above; a server that never
			// answers is cut after a while.
			_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
			return
		}
		if _, err := server.Write(buf); err != nil {
			break
		}
	}
	p.untrack(server)
}

// runMySQLFaultSuite is the fault suite on MySQL: faultRequests sign-ups
// through the recipe as written (its transaction on MySQL) and through
// idemmysql.Do, over connections that a proxy cuts right after a share
// faultRate of the COMMITs, the recipe losing as many of its Redis writes
// after the commit; clients retry with the same key.
func runMySQLFaultSuite(ctx context.Context, _ *pgxpool.Pool, workers, _ int, _ time.Duration) (string, error) {
	if err := openRedis(ctx, "mysql-faults"); err != nil {
		return "", err
	}
	// go-sql-driver logs every connection the proxy cuts.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	defer mysql.SetLogger(log.New(os.Stderr, "[mysql] ", log.Ldate|log.Ltime|log.Lshortfile)) //nolint:errcheck
	proxy, err := newMySQLCutProxy(current.mysqlAddr, faultRate)
	if err != nil {
		return "", err
	}
	defer proxy.Close()
	cut, st, err := openMySQLPool(ctx, proxy.Addr(), workers)
	if err != nil {
		return "", err
	}
	defer cut.Close()
	defer st.close()
	var redisFaults atomic.Int64
	systems := []faultSystem{
		{"redis recipe", func(ctx context.Context, user int64, key string) error {
			return runRecipe(ctx, signupMySQL(cut, st, user), user, key, true, loseRedis(&redisFaults))
		}},
		{"idemmysql Do", func(ctx context.Context, user int64, key string) error {
			_, err := idemmysql.Do(ctx, cut, idem.Key{Scope: "faults", ID: key}, func(ctx context.Context, tx *sql.Tx) (int64, error) {
				return insertSignupMySQL(ctx, tx, st, user)
			})
			return err
		}},
	}
	count := func(ctx context.Context, first, last int64) (map[int64]int, error) {
		rows := map[int64]int{}
		r, err := mysqlDB.QueryContext(ctx, `SELECT user_id, COUNT(*) FROM signups WHERE user_id BETWEEN ? AND ? GROUP BY user_id`, first, last)
		if err != nil {
			return nil, err
		}
		defer r.Close()
		for r.Next() {
			var u int64
			var n int
			if err := r.Scan(&u, &n); err != nil {
				return nil, err
			}
			rows[u] = n
		}
		return rows, r.Err()
	}
	return faultTable(ctx, "mysql-faults", systems, workers, proxy.Cuts, &redisFaults, count)
}
