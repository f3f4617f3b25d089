package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// BouncerEnv names the environment variable that puts PgBouncer between the
// tests and the database: "1" (or "true") runs the pgbouncer found in PATH or
// /usr/sbin, any other non-empty value is the path of the binary to run.
const BouncerEnv = "IDEM_TEST_PGBOUNCER"

// BouncerExecMode is the pgx query execution mode Pool and Conn use through
// PgBouncer. PgBouncer before 1.21 forwards no prepared statements in
// transaction pooling: each transaction, and each statement outside one, may
// run on another server connection. So the named statements of pgx's default
// mode (cache_statement) would be missing or, worse, prepared twice, and
// describe_exec's unnamed statement, prepared in one round trip and bound in
// the next, could be bound on a server connection where another client left
// another unnamed statement. exec sends Parse, Bind, Execute and Sync of the
// unnamed statement together, so the statement never outlives its round
// trip, keeps the parameters on the server (unlike simple_protocol's
// client-side interpolation), and takes one round trip like the default mode.
// A batch is still one Sync, so a batch outside a transaction is still one
// implicit transaction on one server connection.
const BouncerExecMode = pgx.QueryExecModeExec

// bouncerExecModeParam is BouncerExecMode as pgx's default_query_exec_mode
// connection parameter spells it.
const bouncerExecModeParam = "exec"

// SingleServerDatabase is the PgBouncer database that reaches the test
// database through a pool of exactly one server connection: every client
// connection to it runs its transactions on the same PostgreSQL session, in
// turn, so that whatever session state one leaves behind, the next sees.
const SingleServerDatabase = "idem_single_server"

// bouncerPoolSize is the pool of server connections behind the test
// database's entry. Tests open pools of up to 40 client connections and
// send 200 goroutines at a key; the clients beyond the pool queue in
// PgBouncer for a server connection, as they do in production, and the
// machine's PostgreSQL keeps connections for other users.
const bouncerPoolSize = 20

// bouncer is a PgBouncer process started for the tests.
type bouncer struct {
	cmd      *exec.Cmd
	dir      string
	port     int
	database string // the database name clients ask PgBouncer for
	user     string
	password string
	exited   chan struct{}
	exitErr  error
	log      *syncBuffer
}

// bouncerBinary resolves BouncerEnv's value to a binary, or "" when
// PgBouncer is not wanted.
func bouncerBinary() (string, error) {
	v := strings.TrimSpace(os.Getenv(BouncerEnv))
	switch strings.ToLower(v) {
	case "", "0", "false", "no":
		return "", nil
	case "1", "true", "yes":
		if p, err := exec.LookPath("pgbouncer"); err == nil {
			return p, nil
		}
		if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
			return "/usr/sbin/pgbouncer", nil
		}
		return "", fmt.Errorf("%s=%s but no pgbouncer in PATH or /usr/sbin (Debian: apt-get install pgbouncer)", BouncerEnv, v)
	default:
		if _, err := os.Stat(v); err != nil {
			return "", fmt.Errorf("%s=%s: %w", BouncerEnv, v, err)
		}
		return v, nil
	}
}

// startBouncer starts PgBouncer in transaction pooling mode on a free
// loopback port in front of the database at databaseURL, and waits until it
// answers.
func startBouncer(bin, databaseURL string) (*bouncer, error) {
	pc, err := pgconn.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("parsing the database URL: %w", err)
	}
	if pc.Database == "" || pc.User == "" {
		return nil, errors.New("the database URL must name the database and the user")
	}
	dir, err := os.MkdirTemp("", "idem-pgbouncer-")
	if err != nil {
		return nil, err
	}
	// PgBouncer refuses to run as root: as root, start it as the database's
	// usual system user, which must be able to read its files. (Not with
	// its -u option: Linux forgets the parent-death signal when a process
	// changes its own user.)
	var runAs *user.User
	if os.Geteuid() == 0 {
		for _, name := range []string{"postgres", "nobody"} {
			if u, err := user.Lookup(name); err == nil {
				runAs = u
				break
			}
		}
		if runAs == nil {
			os.RemoveAll(dir)
			return nil, errors.New("running as root, and neither a postgres nor a nobody user to run pgbouncer as")
		}
	}
	var lastErr error
	for range 5 {
		b := &bouncer{dir: dir, database: pc.Database, user: pc.User, password: pc.Password,
			exited: make(chan struct{}), log: &syncBuffer{}}
		if b.port, err = freePort(); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := b.writeConfig(pc, runAs); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		b.cmd = exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
		b.cmd.Stdout, b.cmd.Stderr = b.log, b.log
		if b.cmd.SysProcAttr, err = procAttr(runAs); err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		if err := b.cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("starting %s: %w", bin, err)
		}
		go func() { b.exitErr = b.cmd.Wait(); close(b.exited) }()
		if lastErr = b.waitReady(15 * time.Second); lastErr == nil {
			return b, nil
		}
		b.kill()
		if !strings.Contains(b.log.String(), "Address already in use") {
			break // not the port race: retrying will not help
		}
	}
	os.RemoveAll(dir)
	return nil, lastErr
}

// freePort finds a loopback port nothing listens on. Another process may
// take it before PgBouncer does; startBouncer then tries another.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// quoteConnValue quotes a value for a libpq-style connection string in
// PgBouncer's [databases] section.
func quoteConnValue(v string) string {
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
}

// quoteAuthValue quotes a value for PgBouncer's auth_file.
func quoteAuthValue(v string) string {
	return `"` + strings.ReplaceAll(v, `"`, `""`) + `"`
}

func (b *bouncer) writeConfig(pc *pgconn.Config, runAs *user.User) error {
	target := fmt.Sprintf("host=%s port=%d dbname=%s user=%s",
		quoteConnValue(pc.Host), pc.Port, quoteConnValue(pc.Database), quoteConnValue(pc.User))
	if pc.Password != "" {
		target += " password=" + quoteConnValue(pc.Password)
	}
	ini := fmt.Sprintf(`; Generated by pgtest for one test run.
[databases]
%s = %s pool_size=%d
%s = %s pool_size=1 max_db_connections=1

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
; No Unix socket: it would go to /tmp and clash with other instances.
unix_socket_dir =
pool_mode = transaction
; The machine's PostgreSQL trusts local connections, and so does PgBouncer:
; trust still wants the user listed in auth_file, whose password (if any)
; PgBouncer also uses to log in to the server.
auth_type = trust
auth_file = %s
max_client_conn = 1000
default_pool_size = %d
reserve_pool_size = 0
; pgx sends no extra_float_digits, but other drivers (lib/pq) do.
ignore_startup_parameters = extra_float_digits
; Clients beyond the pool queue; fail rather than hang a test forever.
query_wait_timeout = 120
log_connections = 0
log_disconnections = 0
log_pooler_errors = 1
`, quoteIdent(pc.Database), target, bouncerPoolSize,
		SingleServerDatabase, target,
		b.port, filepath.Join(b.dir, "userlist.txt"), bouncerPoolSize)
	files := map[string]string{
		"pgbouncer.ini": ini,
		"userlist.txt":  quoteAuthValue(pc.User) + " " + quoteAuthValue(pc.Password) + "\n",
	}
	for name, content := range files {
		p := filepath.Join(b.dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			return err
		}
		if runAs != nil {
			if err := chown(p, runAs); err != nil {
				return err
			}
		}
	}
	if runAs != nil {
		return chown(b.dir, runAs)
	}
	return nil
}

// quoteIdent quotes a database name for PgBouncer's [databases] keys when it
// needs it.
func quoteIdent(name string) string {
	for _, r := range name {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
		}
	}
	return name
}

func chown(path string, u *user.User) error {
	uid, err := strconv.Atoi(u.Uid)
	if err != nil {
		return err
	}
	gid, err := strconv.Atoi(u.Gid)
	if err != nil {
		return err
	}
	return os.Chown(path, uid, gid)
}

// url is the connection string of a database behind PgBouncer, with the
// execution mode that works through it.
func (b *bouncer) url(database string) string {
	u := url.URL{
		Scheme: "postgres",
		Host:   net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)),
		Path:   "/" + database,
	}
	if b.password != "" {
		u.User = url.UserPassword(b.user, b.password)
	} else {
		u.User = url.User(b.user)
	}
	u.RawQuery = url.Values{
		"sslmode":                 {"disable"},
		"default_query_exec_mode": {bouncerExecModeParam},
	}.Encode()
	return u.String()
}

// waitReady waits until a query through PgBouncer succeeds.
func (b *bouncer) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		select {
		case <-b.exited:
			return fmt.Errorf("pgbouncer exited (%v):\n%s", b.exitErr, b.log.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var conn *pgx.Conn
		conn, err = pgx.Connect(ctx, b.url(b.database))
		if err == nil {
			var one int
			err = conn.QueryRow(ctx, "SELECT 1").Scan(&one)
			conn.Close(ctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("pgbouncer did not answer within %v: %v\n%s", timeout, err, b.log.String())
}

// stop asks PgBouncer to shut down at once (SIGTERM, the immediate
// shutdown; SIGINT would wait for open transactions), kills it if it
// lingers, and removes its directory.
func (b *bouncer) stop() {
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-b.exited:
	case <-time.After(5 * time.Second):
		b.kill()
	}
	os.RemoveAll(b.dir)
}

func (b *bouncer) kill() {
	_ = b.cmd.Process.Kill()
	<-b.exited
}

// syncBuffer collects PgBouncer's log for error messages.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// bouncerVersion is the first line of `pgbouncer --version`.
func bouncerVersion(bin string) string {
	out, err := exec.Command(bin, "--version").Output()
	if err != nil {
		return "pgbouncer (version unknown)"
	}
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}
