package main

// The latency mode (-rtt): every suite runs once per round-trip time, with
// PostgreSQL and Redis behind a proxy that adds that time to every round
// trip (internal/delayproxy). The proxy runs in a child process of its own,
// so that its CPU is measured apart from the client's and reported with
// every result: on a 2-core machine it competes with both.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem/internal/delayproxy"
)

// proxyEnv, when set in the environment, makes the bench a delay proxy:
// "target|rtt". It prints its address, then forwards until its stdin ends.
const proxyEnv = "IDEM_BENCH_DELAY_PROXY"

// runProxyChild is the bench as a proxy process.
func runProxyChild(spec string) error {
	target, rttText, ok := strings.Cut(spec, "|")
	rtt, err := time.ParseDuration(rttText)
	if !ok || err != nil {
		return fmt.Errorf("%s: want target|rtt, got %q", proxyEnv, spec)
	}
	// The proxy's sleeping thread keeps its P (see delayproxy): one more
	// for the goroutines that read and write.
	runtime.GOMAXPROCS(runtime.NumCPU() + 1)
	p, err := delayproxy.New(target, rtt)
	if err != nil {
		return err
	}
	fmt.Println(p.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return p.Close()
}

// proxyProc is a delay proxy running as a child process.
type proxyProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	addr  string
}

// startProxy starts a delay proxy in front of target in a child process.
func startProxy(target string, rtt time.Duration) (*proxyProc, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), proxyEnv+"="+target+"|"+rtt.String())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = stdin.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("the delay proxy did not start: %w", err)
	}
	return &proxyProc{cmd: cmd, stdin: stdin, addr: strings.TrimSpace(line)}, nil
}

// stop ends the proxy process.
func (p *proxyProc) stop() {
	_ = p.stdin.Close()
	_ = p.cmd.Wait()
}

// cpu is the CPU time (user and system) the proxy process has used so far,
// read from /proc (in clock ticks of 10ms); 0 where /proc is missing.
func (p *proxyProc) cpu() time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.cmd.Process.Pid) + "/stat")
	if err != nil {
		return 0
	}
	// The fields after the command name, which is in parentheses: utime
	// and stime are the 12th and 13th of them.
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// latency is the network one configuration puts between the bench and its
// servers.
type latency struct {
	rtt      time.Duration // as set; 0: straight to the servers
	measured time.Duration // the round trip added, measured (SELECT 1 proxied minus direct)
	direct   time.Duration // a SELECT 1 round trip without the proxy
	proxies  []*proxyProc
	// pg says whether PostgreSQL is in use; pgURL, mysqlAddr ("": not
	// in use) and redisAddr are where the suites connect.
	pg        bool
	pgURL     string
	mysqlAddr string
	redisAddr string
	// mysqlDirect and mysqlMeasured are direct and measured for MySQL when
	// PostgreSQL is in use too (the fields above are PostgreSQL's then).
	mysqlDirect, mysqlMeasured time.Duration
}

// current is the configuration the suites run under.
var current = &latency{redisAddr: "127.0.0.1:6379"}

// proxyCPU is the CPU the proxies have used so far.
func (l *latency) proxyCPU() time.Duration {
	var d time.Duration
	for _, p := range l.proxies {
		d += p.cpu()
	}
	return d
}

func (l *latency) close() {
	for _, p := range l.proxies {
		p.stop()
	}
}

// label names the configuration in reports.
func (l *latency) label() string {
	s := fmt.Sprintf("added RTT %v, measured %v (SELECT 1 round trip %v direct)",
		l.rtt, l.measured.Round(time.Microsecond), l.direct.Round(time.Microsecond))
	if l.rtt == 0 {
		s = fmt.Sprintf("loopback (SELECT 1 round trip %v)", l.direct.Round(time.Microsecond))
	}
	if l.mysqlDirect > 0 {
		if l.rtt == 0 {
			s += fmt.Sprintf("; MySQL: SELECT 1 round trip %v", l.mysqlDirect.Round(time.Microsecond))
		} else {
			s += fmt.Sprintf("; MySQL: measured %v (SELECT 1 round trip %v direct)",
				l.mysqlMeasured.Round(time.Microsecond), l.mysqlDirect.Round(time.Microsecond))
		}
	}
	return s
}

// parseRTTs reads -rtt: comma-separated durations, 0 for none.
func parseRTTs(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "0" {
			out = append(out, 0)
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("-rtt: bad duration %q", f)
		}
		out = append(out, d)
	}
	return out, nil
}

// openLatency sets up rtt in front of the PostgreSQL server databaseURL
// names when withPG, of the MySQL server at mysqlAddr (none when "") and of
// Redis when withRedis, and measures what it adds.
func openLatency(ctx context.Context, withPG bool, databaseURL, mysqlAddr string, rtt time.Duration, withRedis bool) (*latency, error) {
	l := &latency{rtt: rtt, pg: withPG, pgURL: databaseURL, mysqlAddr: mysqlAddr, redisAddr: "127.0.0.1:6379"}
	var pgDirect, myDirect time.Duration
	if withPG {
		d, err := pingPostgres(ctx, databaseURL)
		if err != nil {
			return nil, err
		}
		pgDirect = d
	}
	if mysqlAddr != "" {
		d, err := pingMySQL(ctx, mysqlAddr)
		if err != nil {
			return nil, err
		}
		myDirect = d
	}
	l.setDirect(withPG, pgDirect, myDirect)
	if rtt == 0 {
		return l, nil
	}
	if withPG {
		cfg, err := pgx.ParseConfig(databaseURL)
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(cfg.Host, "/") {
			return nil, fmt.Errorf("-rtt puts a TCP proxy in front of PostgreSQL, which this connection reaches through the Unix socket in %s: set DATABASE_URL to its TCP address, e.g. postgres://postgres@127.0.0.1:5432/postgres", cfg.Host)
		}
		pg, err := startProxy(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), rtt)
		if err != nil {
			return nil, err
		}
		l.proxies = append(l.proxies, pg)
		l.pgURL = withHostPort(cfg, pg.addr)
	}
	if mysqlAddr != "" {
		mp, err := startProxy(mysqlAddr, rtt)
		if err != nil {
			l.close()
			return nil, err
		}
		l.proxies = append(l.proxies, mp)
		l.mysqlAddr = mp.addr
	}
	if withRedis {
		rp, err := startProxy(l.redisAddr, rtt)
		if err != nil {
			l.close()
			return nil, err
		}
		l.proxies = append(l.proxies, rp)
		l.redisAddr = rp.addr
	}
	var pgProxied, myProxied time.Duration
	if withPG {
		d, err := pingPostgres(ctx, l.pgURL)
		if err != nil {
			l.close()
			return nil, err
		}
		pgProxied = d
	}
	if mysqlAddr != "" {
		d, err := pingMySQL(ctx, l.mysqlAddr)
		if err != nil {
			l.close()
			return nil, err
		}
		myProxied = d
	}
	l.setMeasured(withPG, pgProxied-pgDirect, myProxied-myDirect)
	if withRedis {
		if _, err := pingRedis(ctx, l.redisAddr); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
}

// setDirect records the direct round trips: PostgreSQL's as the run's when
// it is in use (withPG), with MySQL's beside it; otherwise MySQL's.
func (l *latency) setDirect(withPG bool, pg, my time.Duration) {
	if !withPG {
		l.direct = my
		return
	}
	l.direct, l.mysqlDirect = pg, my
}

// setMeasured records the added round trips, as setDirect does.
func (l *latency) setMeasured(withPG bool, pg, my time.Duration) {
	if !withPG {
		l.measured = my
		return
	}
	l.measured, l.mysqlMeasured = pg, my
}

// withHostPort is cfg's database URL pointed at addr, over TCP without TLS.
func withHostPort(cfg *pgx.ConnConfig, addr string) string {
	u := url.URL{Scheme: "postgres", Host: addr, Path: "/" + cfg.Database, RawQuery: "sslmode=disable"}
	if cfg.Password != "" {
		u.User = url.UserPassword(cfg.User, cfg.Password)
	} else {
		u.User = url.User(cfg.User)
	}
	return u.String()
}

// pingPostgres is the median time of 200 SELECT 1 round trips on one
// connection, after a warm-up.
func pingPostgres(ctx context.Context, databaseURL string) (time.Duration, error) {
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	ping := func() error {
		var one int
		return conn.QueryRow(ctx, "SELECT 1", pgx.QueryExecModeSimpleProtocol).Scan(&one)
	}
	if _, err := delayproxy.MeasureRTT(20, ping); err != nil {
		return 0, err
	}
	return delayproxy.MeasureRTT(200, ping)
}

// pingRedis is the median time of 100 PING round trips.
func pingRedis(ctx context.Context, addr string) (time.Duration, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer c.Close()
	return delayproxy.MeasureRTT(100, func() error { return c.Ping(ctx).Err() })
}

// latencyPool opens the pool the suites use under l.
func latencyPool(ctx context.Context, l *latency, maxConns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(l.pgURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	return pgxpool.NewWithConfig(ctx, cfg)
}
