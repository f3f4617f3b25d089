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
	// pgURL and redisAddr are where the suites connect.
	pgURL     string
	redisAddr string
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
	if l.rtt == 0 {
		return fmt.Sprintf("loopback (SELECT 1 round trip %v)", l.direct.Round(time.Microsecond))
	}
	return fmt.Sprintf("added RTT %v, measured %v (SELECT 1 round trip %v direct)",
		l.rtt, l.measured.Round(time.Microsecond), l.direct.Round(time.Microsecond))
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

// openLatency sets up rtt in front of the server databaseURL names (and of
// Redis when withRedis), and measures what it adds.
func openLatency(ctx context.Context, databaseURL string, rtt time.Duration, withRedis bool) (*latency, error) {
	l := &latency{rtt: rtt, pgURL: databaseURL, redisAddr: "127.0.0.1:6379"}
	direct, err := pingPostgres(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	l.direct = direct
	if rtt == 0 {
		return l, nil
	}
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
	if withRedis {
		rp, err := startProxy(l.redisAddr, rtt)
		if err != nil {
			l.close()
			return nil, err
		}
		l.proxies = append(l.proxies, rp)
		l.redisAddr = rp.addr
	}
	proxied, err := pingPostgres(ctx, l.pgURL)
	if err != nil {
		l.close()
		return nil, err
	}
	l.measured = proxied - direct
	if withRedis {
		if _, err := pingRedis(ctx, l.redisAddr); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
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
