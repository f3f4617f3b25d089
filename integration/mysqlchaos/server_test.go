//go:build chaos

package mysqlchaos_test

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// mariadb is a MariaDB server the test installed in a temporary directory
// and runs itself, on a free loopback port; root connects over TCP without
// a password.
type mariadb struct {
	t       *testing.T
	bin     string // mariadbd
	dir     string // the temporary directory: datadir, socket, logs
	port    int
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited
	version string
}

// serverArgs are mariadbd's options after --no-defaults (which must come
// first): the test's directory and port, and InnoDB kept small so that the
// server starts in a second. Durability is the default one
// (innodb_flush_log_at_trx_commit=1): a killed server keeps every COMMIT
// it answered.
func (m *mariadb) serverArgs() []string {
	args := []string{
		"--no-defaults",
		"--datadir=" + filepath.Join(m.dir, "data"),
		"--port=" + strconv.Itoa(m.port),
		"--bind-address=127.0.0.1",
		"--socket=" + filepath.Join(m.dir, "mariadbd.sock"),
		"--pid-file=" + filepath.Join(m.dir, "mariadbd.pid"),
		"--log-error=" + filepath.Join(m.dir, "mariadbd.log"),
		"--tmpdir=" + m.dir,
		"--skip-name-resolve",
		"--max-connections=300",
		"--innodb-buffer-pool-size=64M",
		"--innodb-log-file-size=16M",
	}
	if os.Geteuid() == 0 {
		// mariadbd refuses to run as root unless told to; this server
		// lives in a temporary directory and ends with the test.
		args = append(args, "--user=root")
	}
	return args
}

// findBinary returns the path of a MariaDB program, from PATH or /usr/sbin
// and /usr/bin, or "" when there is none.
func findBinary(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, dir := range []string{"/usr/sbin", "/usr/bin"} {
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// startMariaDB installs a fresh data directory in a temporary directory,
// starts mariadbd on it and waits until root can connect. It skips the
// test when MariaDB is not installed, unless CI is set (then it fails).
// The server is stopped in t.Cleanup.
func startMariaDB(t *testing.T) *mariadb {
	t.Helper()
	install, server := findBinary("mariadb-install-db"), findBinary("mariadbd")
	if install == "" || server == "" {
		msg := "the MariaDB soak starts a MariaDB server of its own and needs mariadb-install-db and mariadbd " +
			"(Debian: apt-get install mariadb-server); not found on PATH, in /usr/sbin or /usr/bin"
		if os.Getenv("CI") != "" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	m := &mariadb{t: t, bin: server, dir: t.TempDir(), port: freePort(t)}
	args := []string{
		"--no-defaults",
		"--datadir=" + filepath.Join(m.dir, "data"),
		"--auth-root-authentication-method=normal",
		"--skip-test-db",
		"--skip-name-resolve",
		"--innodb-buffer-pool-size=64M",
		"--innodb-log-file-size=16M",
	}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root")
	}
	out, err := exec.Command(install, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	t.Cleanup(func() { m.stop(syscall.SIGTERM) })
	m.start()
	db := m.rootDB("")
	defer db.Close()
	if err := db.QueryRow(`SELECT VERSION()`).Scan(&m.version); err != nil {
		t.Fatalf("asking the server's version: %v", err)
	}
	return m
}

// freePort returns a loopback port nothing listens on now, below the
// kernel's range of ephemeral ports: while the server is down, the proxy
// dials its port again and again, and a dial from an ephemeral port could
// briefly hold the very port the server is to bind again.
func freePort(t *testing.T) int {
	t.Helper()
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 2000 {
				low = n
			}
		}
	}
	for range 100 {
		port := 1024 + rand.IntN(low-1024)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatalf("no free port found below %d", low)
	return 0
}

// addr is the server's host:port.
func (m *mariadb) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(m.port)) }

// rootDB opens a pool on the server itself (not through the proxy) as
// root, in database name ("" for none).
func (m *mariadb) rootDB(name string) *sql.DB {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = m.addr()
	cfg.DBName = name
	cfg.Timeout = 2 * time.Second
	c, err := mysql.NewConnector(cfg)
	if err != nil {
		m.t.Fatalf("root connector: %v", err)
	}
	db := sql.OpenDB(c)
	db.SetMaxOpenConns(4)
	return db
}

// start starts mariadbd on the data directory and waits until it answers.
func (m *mariadb) start() {
	m.t.Helper()
	cmd := exec.Command(m.bin, m.serverArgs()...)
	if err := cmd.Start(); err != nil {
		m.t.Fatalf("starting %s: %v", m.bin, err)
	}
	m.cmd = cmd
	exited := make(chan struct{})
	m.exited = exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	db := m.rootDB("")
	defer db.Close()
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-exited:
			m.t.Fatalf("mariadbd exited before it answered (%v):\n%s", cmd.ProcessState, m.logTail())
		default:
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("mariadbd did not answer within a minute: %v\n%s", err, m.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends sig to mariadbd and waits for it to exit; after 30 seconds it
// kills it. A server already stopped is left alone.
func (m *mariadb) stop(sig syscall.Signal) {
	if m.cmd == nil {
		return
	}
	select {
	case <-m.exited:
		m.cmd = nil
		return
	default:
	}
	_ = m.cmd.Process.Signal(sig)
	select {
	case <-m.exited:
	case <-time.After(30 * time.Second):
		m.t.Logf("mariadbd did not exit within 30s of %v; killing it", sig)
		_ = m.cmd.Process.Kill()
		<-m.exited
	}
	m.cmd = nil
}

// restart stops the server with sig, starts it again on the same data
// directory and port, and returns how long it was away.
func (m *mariadb) restart(sig syscall.Signal) time.Duration {
	m.t.Helper()
	begin := time.Now()
	m.stop(sig)
	m.start()
	return time.Since(begin)
}

// logTail is the end of the server's error log, for a failure message.
func (m *mariadb) logTail() string {
	b, err := os.ReadFile(filepath.Join(m.dir, "mariadbd.log"))
	if err != nil {
		return fmt.Sprintf("(no error log: %v)", err)
	}
	if len(b) > 4000 {
		b = b[len(b)-4000:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
	}
	return string(b)
}
