// Command bench measures what idem costs against what a user would write
// without it, in one process, on one database, in interleaved rounds.
//
//	go run ./bench                       # the core suite: 16 workers, 5 rounds of 3s
//	go run ./bench -suites core,transition,inbox -rounds 7 -markdown out.md
//	go run ./bench -suites core,redis,http -rtt 0,200us,1ms -workers 1,16,64 \
//		-json docs/bench/latency.json -chart docs/bench/latency.png
//
// With -rtt, every suite runs once per round-trip time, with PostgreSQL and
// Redis behind a proxy on 127.0.0.1 (in a child process) that delays each
// direction by half of it, keeping order and pipelining: services talk to
// their database across a network, where each round trip costs time rather
// than CPU. The report gives the round trip the proxy really added, measured
// with SELECT 1 through it and straight, and the proxy's CPU per operation,
// which on a small machine competes with the client and the server.
//
// Suites (the first variant of each is its baseline):
//
//	core        one INSERT per operation, every key new:
//	            bare             BEGIN; INSERT; COMMIT with pgx, one statement per round trip
//	            sql-model        Do's five statements (its own claim and completion), pipelined
//	                             as Do sends them, hand-written with pgx and no library logic:
//	                             what the record costs the database
//	            Do               idem.Do: BEGIN+claim pipelined, INSERT, completion+COMMIT pipelined
//	            Do, WithHoldTimeout  the same with a hold timeout
//	            WithIdempotency  BEGIN; idem.WithIdempotency (claim, savepoint, INSERT, completion); COMMIT
//	floor       the record's SQL added to a bare transaction a piece at a time,
//	            hand-written with pgx: +keyed insert (one more row, keyed like a
//	            record), +claim (the claim alone), sql-model (claim and
//	            completion), Do, sql-model/WithIdempotency (what WithIdempotency
//	            adds to a caller's transaction) and WithIdempotency: what each
//	            piece costs on this machine
//	model       sql-model, Do and bare alone, so that every round measures Do
//	            and its own SQL seconds apart: the ratio of Do to sql-model with
//	            the least drift between them
//	shape       Do's statements, hand-written as sql-model is, against copies of
//	            the record table that differ in one thing each: fillfactor 100,
//	            a narrow row, a BRIN index on expires_at, no index on it
//	transition  PENDING -> PAID on a fresh row per operation:
//	            hand-written UPDATE ... WHERE id = $1 AND status = 'PENDING' with a row-count
//	            check, against StateMachine.Transition
//	inbox       a new message per operation whose handler inserts one row: a bare
//	            transaction, against the same inside ConsumeOnce
//	http        a POST whose handler inserts one row: with its own bare transaction,
//	            calling idem.Do itself (the floor under any middleware), behind
//	            idemhttp.Middleware with a new key per request, and replaying one key
//	redis       a sign-up per operation through the usual Redis recipe
//	            (SET NX EX claim, business-key check, insert, response SET) against
//	            the same through idem.Do (Redis at 127.0.0.1:6379)
//	faults      the recipe and Do over connections cut right after COMMIT (and, for
//	            the recipe, Redis writes lost after the commit), clients retrying
//	            with the same key: duplicates, stuck keys, wrong errors, lost writes
//	hotkey      1,000 concurrent Do calls with one key, wait and no-wait: the time
//	            until every one is answered, and the number of executions (1)
//	tablesize   Do with random keys against record tables holding 0, 1,000,000 and
//	            10,000,000 records (-table-sizes), one table per size, in interleaved
//	            rounds; the process's peak memory
//	purge       Claim+Complete throughput and p99 alone, then while Purge deletes
//	            1,000,000 expired records (-purge-rows), paced at -purge-rate rows/s
//	            (250,000; 0 runs it flat out); the purge rate
//	mysql-model  on MySQL (-mysql-dsn): idemmysql.Do against its own statements
//	             written by hand on database/sql (sql-model, the baseline) and a
//	             bare transaction, alone so that each round pairs them
//	mysql-recipe on MySQL: a sign-up per operation through the Redis recipe as
//	             the scenario writes it (SET NX, EXISTS, the transaction, three
//	             SETs one by one; the baseline), the same with the SETs
//	             pipelined, idemmysql.Do, a bare transaction, and that with one
//	             and with two plain primary-key writes of the key's (the floor
//	             under any record kept in the database)
//	mysql-floor  on MySQL: a sign-up per operation from two plain writes of a
//	             row of the key's (the baseline) up to idemmysql.Do, one piece of
//	             the record at a time: its columns, its index on expires_at, its
//	             own SQL by hand; the recipe as written for scale
//	mysql-faults the faults suite on MySQL: the recipe as written against
//	             idemmysql.Do, over connections cut right after COMMIT
//
// Rounds rotate the order of the variants, and the report gives each
// variant's median throughput and the median of its per-round ratios to the
// baseline, because this machine is noisy.
//
// It connects with DATABASE_URL or the PG* defaults, works in a schema of its
// own (idem_bench) and drops it at the end. The mysql-* suites need no
// PostgreSQL: they connect with -mysql-dsn (default $TEST_MYSQL_DSN, or
// root@tcp(127.0.0.1:3306)/test), work in a database of their own
// (idem_bench) and drop it at the end.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/migrations"
)

const schema = "idem_bench"

type variant struct {
	name string
	op   func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error
}

func insertRow(ctx context.Context, tx pgx.Tx) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO idem_bench.orders (user_id, amount) VALUES ($1, $2) RETURNING id`, 42, 999).Scan(&id)
	return id, err
}

var tableOpt = idem.WithTable(schema, idem.DefaultTable)

// bareInsert is the baseline: BEGIN; INSERT; COMMIT with pgx.
func bareInsert(ctx context.Context, pool *pgxpool.Pool, _ idem.Key) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := insertRow(ctx, tx); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// suite is a set of variants measured against its first one, the baseline.
type suite struct {
	name  string
	about string
	setup func(ctx context.Context, pool *pgxpool.Pool) error
	// teardown, when set, undoes setup before the pool closes.
	teardown func()
	variants []variant
	// custom, when set, replaces the interleaved comparison of variants.
	custom func(ctx context.Context, pool *pgxpool.Pool, workers, rounds int, duration time.Duration) (string, error)
	// newKeysOnly keeps -dups off the suite: every operation has a new
	// key (the Redis recipe answers a duplicate in flight with an error,
	// which would end the run).
	newKeysOnly bool
	// bare names the variant that is a bare transaction, for the ratios to
	// bare of the JSON results and the latency chart; the baseline if "".
	bare string
	// mysql marks a suite that runs on MySQL (-mysql-dsn) alone: its
	// variants take no PostgreSQL pool (they are given nil when no
	// PostgreSQL suite runs) and use mysqlDB.
	mysql bool
}

var suites = []suite{
	{name: "core", about: "one INSERT per operation (a duplicate request replays)", variants: coreVariants},
	{name: "floor", about: "the record's SQL added to a bare transaction a piece at a time, every key new", setup: setupFloor, variants: floorVariants, newKeysOnly: true},
	{name: "model", about: "Do against its own statements by hand, the two alone so that each round pairs them", variants: modelVariants, newKeysOnly: true, bare: "bare"},
	{name: "shape", about: "Do's statements, hand-written, against copies of the record table that differ in one thing each", setup: setupShape, variants: shapeVariants, newKeysOnly: true},
	{name: "transition", about: "one PENDING -> PAID per operation, each on a fresh row", setup: setupTransition, variants: transitionVariants},
	{name: "inbox", about: "one message per operation (a duplicate is a redelivery); the handler inserts one row", variants: inboxVariants},
	{name: "http", about: "POST through net/http (httptest, keep-alive); the handler inserts one row", setup: setupHTTP, variants: httpVariants},
	{name: "grpc", about: "a unary gRPC method on loopback TCP that inserts one row: behind idemgrpc's interceptor against the method calling idem.Do itself", setup: setupGRPC, teardown: teardownGRPC, variants: grpcVariants, newKeysOnly: true, bare: "bare handler"},
	{name: "redis", about: "a sign-up with a new token per operation: the usual Redis recipe against idem.Do", setup: setupRedis, variants: redisVariants, newKeysOnly: true, bare: "bare transaction"},
	{name: "faults", variants: []variant{{"redis recipe", redisRecipe}}, custom: runFaultSuite},
	{name: "hotkey", variants: []variant{{"Do, one key", bareInsert}}, custom: runHotKeySuite},
	{name: "tablesize", custom: runTableSizeSuite},
	{name: "purge", variants: []variant{{"Claim+Complete", claimComplete}}, custom: runPurgeSuite},
	{name: "sql", about: "database/sql through pgx's stdlib driver: idemsql.Do against a bare database/sql transaction running the same INSERT", setup: setupSQL, teardown: teardownSQL, variants: sqlVariants, newKeysOnly: true, bare: "bare database/sql"},
	{name: "mysql-model", about: "MySQL: idemmysql.Do against its own statements by hand on database/sql, and a bare transaction", variants: mysqlModelVariants, newKeysOnly: true, bare: "bare", mysql: true},
	{name: "mysql-recipe", about: "MySQL: a sign-up with a new token per operation: the Redis recipe as written, and pipelined, against idemmysql.Do, a bare transaction and the least a record in the database adds to it", setup: setupMySQLRecipe, variants: mysqlRecipeVariants, newKeysOnly: true, bare: "bare transaction", mysql: true},
	{name: "mysql-floor", about: "MySQL: a sign-up with a new key per operation, from two plain writes of a row of the key's up to idemmysql.Do, one piece of the record at a time", setup: setupMySQLFloor, variants: mysqlFloorVariants, newKeysOnly: true, mysql: true},
	{name: "mysql-faults", variants: []variant{{"redis recipe", mysqlRecipeAsWritten}}, custom: runMySQLFaultSuite, mysql: true},
}

// suiteList lists the suites, for -suites and its errors.
func suiteList() string {
	names := make([]string, len(suites))
	for i, su := range suites {
		names[i] = su.name
	}
	return strings.Join(names, ", ")
}

var coreVariants = []variant{
	{"bare", bareInsert},
	{"sql-model", sqlModel},
	{"Do", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		_, err := idem.Do(ctx, pool, key, insertRow, tableOpt)
		return err
	}},
	{"Do, WithHoldTimeout", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		_, err := idem.Do(ctx, pool, key, insertRow, tableOpt, idem.WithHoldTimeout(time.Minute))
		return err
	}},
	{"Do, NoWait", func(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
		_, err := idem.Do(ctx, pool, key, insertRow, tableOpt, idem.NoWait())
		return err
	}},
	{"WithIdempotency", withIdempotencyInsert},
}

// modelVariants put Do beside its SQL model and nothing else but a bare
// transaction, so that the two are measured seconds apart in every round.
var modelVariants = []variant{coreVariants[1], coreVariants[2], coreVariants[0]}

func withIdempotencyInsert(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := idem.WithIdempotency(ctx, tx, key, insertRow, tableOpt); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

type sample struct {
	ops      int64
	elapsed  time.Duration
	p50, p99 time.Duration
	cpu      time.Duration // this process's CPU time (user+system) during the run
	proxyCPU time.Duration // the delay proxies' CPU time during the run (-rtt)
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func (s sample) throughput() float64 { return float64(s.ops) / s.elapsed.Seconds() }

var keySeq atomic.Int64

// dupShares, jsonPath and chartPath come from -dups, -json and -chart.
var (
	dupShares           []float64
	jsonPath, chartPath string
)

func measure(ctx context.Context, pool *pgxpool.Pool, v variant, workers int, d time.Duration) (sample, error) {
	stop := make(chan struct{})
	t := time.AfterFunc(d, func() { close(stop) })
	defer t.Stop()
	s, err := measureUntil(ctx, pool, v, workers, stop)
	if err != nil {
		return sample{}, fmt.Errorf("%s: %w", v.name, err)
	}
	return s, nil
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianDur(xs []time.Duration) time.Duration {
	f := make([]float64, len(xs))
	for i, x := range xs {
		f[i] = float64(x)
	}
	return time.Duration(median(f))
}

func main() {
	workersFlag := flag.String("workers", "16", "comma-separated worker counts")
	rounds := flag.Int("rounds", 5, "interleaved rounds per worker count")
	duration := flag.Duration("duration", 3*time.Second, "length of one measurement")
	warmup := flag.Duration("warmup", time.Second, "warm-up per variant before the rounds")
	markdown := flag.String("markdown", "", "also write the report to this file")
	suitesFlag := flag.String("suites", "core", "comma-separated suites: "+suiteList())
	tableSizesFlag := flag.String("table-sizes", "0,1000000,10000000", "record counts the tablesize suite measures at")
	dupsFlag := flag.String("dups", "0", "comma-separated shares of duplicate requests for the core, transition, inbox and http suites, e.g. 0,0.5,0.9")
	jsonOut := flag.String("json", "", "also write every result and the machine description to this JSON file")
	replot := flag.String("replot", "", "draw -chart from this JSON file of an earlier run (-json) instead of measuring")
	chartOut := flag.String("chart", "", "also draw a chart to this PNG file: with one -rtt, the core suite's throughput against workers (duplicates 0); with several, the ratio to a bare transaction against the added round-trip time")
	rttFlag := flag.String("rtt", "0", "comma-separated round-trip times to add in front of PostgreSQL, MySQL and Redis through a delay proxy on 127.0.0.1, e.g. 0,200us,1ms (0: none)")
	flag.StringVar(&mysqlDSN, "mysql-dsn", mysqlDSN, "the MySQL or MariaDB server of the mysql-* suites, as a go-sql-driver/mysql DSN (default $TEST_MYSQL_DSN, or root@tcp(127.0.0.1:3306)/test); the bench creates the database "+mysqlDatabase+" there and drops it at the end")
	flag.Int64Var(&purgeRows, "purge-rows", purgeRows, "expired records the purge suite purges per round")
	flag.IntVar(&purgeBatch, "purge-batch", purgeBatch, "the purge suite's batch size (0: Purge's default)")
	flag.IntVar(&purgeRate, "purge-rate", purgeRate, "the purge suite's PurgeParams.RowsPerSecond (0: unpaced)")
	flag.Int64Var(&transitionRows, "transition-rows", transitionRows, "PENDING rows the transition suite prepares (one per operation)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	if spec := os.Getenv(proxyEnv); spec != "" {
		if err := runProxyChild(spec); err != nil {
			fmt.Fprintln(os.Stderr, "bench: delay proxy:", err)
			os.Exit(1)
		}
		return
	}
	rtts, err := parseRTTs(*rttFlag)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	tableSizes = nil
	for _, f := range strings.Split(*tableSizesFlag, ",") {
		n, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || n < 0 {
			fmt.Fprintln(os.Stderr, "bench: -table-sizes: bad size", f)
			os.Exit(2)
		}
		tableSizes = append(tableSizes, n)
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	for _, f := range strings.Split(*dupsFlag, ",") {
		d, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || d < 0 || d >= 1 {
			fmt.Fprintln(os.Stderr, "bench: -dups: want shares in [0, 1), got", f)
			os.Exit(2)
		}
		dupShares = append(dupShares, d)
	}
	jsonPath, chartPath = *jsonOut, *chartOut
	if *replot != "" {
		if err := replotChart(*replot, *chartOut); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(*workersFlag, *suitesFlag, rtts, *rounds, *duration, *warmup, *markdown); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// runSuites runs the suites named under the network l, on a pool of its own.
func runSuites(ctx context.Context, l *latency, suiteNames []string, workerCounts []int, rounds int, duration, warmup time.Duration, report *strings.Builder) error {
	var pool *pgxpool.Pool // nil when no PostgreSQL suite runs
	if l.pg {
		p, err := latencyPool(ctx, l, slices.Max(workerCounts))
		if err != nil {
			return err
		}
		defer p.Close()
		pool = p
	}
	if l.mysqlAddr != "" {
		if err := openMySQL(ctx, l.mysqlAddr, slices.Max(workerCounts)); err != nil {
			return err
		}
		defer closeMySQL()
	}
	for _, su := range suites {
		if !slices.Contains(suiteNames, su.name) {
			continue
		}
		if su.setup != nil {
			if err := su.setup(ctx, pool); err != nil {
				return fmt.Errorf("%s: %w", su.name, err)
			}
		}
		if su.teardown != nil {
			defer su.teardown()
		}
		shares := dupShares
		if su.custom != nil || su.newKeysOnly || len(shares) == 0 {
			shares = []float64{0}
		}
		for _, share := range shares {
			dupRate = share
			for _, workers := range workerCounts {
				run := func() (string, error) { return runSuite(ctx, pool, su, workers, rounds, duration, warmup) }
				if su.custom != nil {
					run = func() (string, error) { return su.custom(ctx, pool, workers, rounds, duration) }
				}
				table, err := run()
				if err != nil {
					return err
				}
				fmt.Print(table)
				report.WriteString(table)
			}
		}
		dupRate = 0
	}
	return nil
}

// runSuite measures a suite's variants at one worker count in interleaved,
// rotated rounds and returns its markdown table.
func runSuite(ctx context.Context, pool *pgxpool.Pool, su suite, workers, rounds int, duration, warmup time.Duration) (string, error) {
	variants := su.variants
	base := variants[0].name
	bare := cmp.Or(su.bare, base)
	for _, v := range variants { // warm the pool and the statement caches
		if _, err := measure(ctx, pool, v, workers, warmup); err != nil {
			return "", err
		}
	}
	samples := map[string][]sample{}
	ratios := map[string][]float64{}
	bareRatios := map[string][]float64{}
	for r := range rounds {
		order := slices.Clone(variants)
		for i := 0; i < r%len(order); i++ { // rotate the order every round
			order = append(order[1:], order[0])
		}
		round := map[string]sample{}
		for _, v := range order {
			s, err := measure(ctx, pool, v, workers, duration)
			if err != nil {
				return "", err
			}
			round[v.name] = s
			samples[v.name] = append(samples[v.name], s)
		}
		for _, v := range variants {
			ratios[v.name] = append(ratios[v.name], round[v.name].throughput()/round[base].throughput())
			bareRatios[v.name] = append(bareRatios[v.name], round[v.name].throughput()/round[bare].throughput())
		}
		fmt.Fprintf(os.Stderr, "  %s workers=%d round %d/%d done\n", su.name, workers, r+1, rounds)
	}
	var table strings.Builder
	proxied := len(current.proxies) > 0
	fmt.Fprintf(&table, "%s: %s; workers=%d; duplicate requests %.0f%%\n\n", su.name, su.about, workers, dupRate*100)
	fmt.Fprintf(&table, "| variant | ops/s (median) | ratio to %s (median of rounds) | ratio range | p50 | p99 | client CPU/op |", base)
	if proxied {
		fmt.Fprintf(&table, " proxy CPU/op |\n|---|---:|---:|---|---:|---:|---:|---:|\n")
	} else {
		fmt.Fprintf(&table, "\n|---|---:|---:|---|---:|---:|---:|\n")
	}
	for _, v := range variants {
		var tps []float64
		var p50s, p99s, cpus, proxyCPUs []time.Duration
		for _, s := range samples[v.name] {
			tps = append(tps, s.throughput())
			p50s = append(p50s, s.p50)
			p99s = append(p99s, s.p99)
			cpus = append(cpus, s.cpu/time.Duration(max(s.ops, 1)))
			proxyCPUs = append(proxyCPUs, s.proxyCPU/time.Duration(max(s.ops, 1)))
		}
		addResult(result{Suite: su.name, Dups: dupRate, Workers: workers, Variant: v.name, OpsPerS: median(tps),
			Ratio: median(ratios[v.name]), RatioToBare: median(bareRatios[v.name]),
			RatioMin: slices.Min(bareRatios[v.name]), RatioMax: slices.Max(bareRatios[v.name]),
			P50Ms: ms(medianDur(p50s)), P99Ms: ms(medianDur(p99s)), Rounds: rounds,
			RTTMicro: current.rtt.Microseconds(), MeasuredRTTMicro: current.measured.Microseconds(),
			ClientCPUMicro: float64(medianDur(cpus).Nanoseconds()) / 1e3, ProxyCPUMicro: float64(medianDur(proxyCPUs).Nanoseconds()) / 1e3})
		fmt.Fprintf(&table, "| %s | %.0f | %.2f | %.2f-%.2f | %v | %v | %v |", v.name, median(tps), median(ratios[v.name]),
			slices.Min(ratios[v.name]), slices.Max(ratios[v.name]),
			medianDur(p50s).Round(10*time.Microsecond), medianDur(p99s).Round(10*time.Microsecond), medianDur(cpus).Round(time.Microsecond))
		if proxied {
			fmt.Fprintf(&table, " %v |", medianDur(proxyCPUs).Round(time.Microsecond))
		}
		table.WriteString("\n")
	}
	fmt.Fprintln(&table)
	return table.String(), nil
}

func run(workersFlag, suitesFlag string, rtts []time.Duration, rounds int, duration, warmup time.Duration, markdown string) error {
	suiteNames := strings.Split(suitesFlag, ",")
	var withPG, withMySQL, withRedis bool
	for _, n := range suiteNames {
		i := slices.IndexFunc(suites, func(s suite) bool { return s.name == n })
		if i < 0 {
			return fmt.Errorf("-suites: unknown suite %q (%s)", n, suiteList())
		}
		withPG = withPG || !suites[i].mysql
		withMySQL = withMySQL || suites[i].mysql
		withRedis = withRedis || n == "redis" || n == "mysql-recipe" || n == "mysql-floor"
	}
	var workerCounts []int
	for _, w := range strings.Split(workersFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 1 {
			return fmt.Errorf("-workers: bad count %q", w)
		}
		workerCounts = append(workerCounts, n)
	}
	if rounds < 1 || duration <= 0 {
		return fmt.Errorf("-rounds and -duration must be positive")
	}
	ctx := context.Background()
	var servers []string
	var version, syncCommit, databaseURL, mysqlAddr string
	if withPG {
		databaseURL = os.Getenv("DATABASE_URL")
		v, sc, drop, err := setupPostgres(ctx, databaseURL, slices.Max(workerCounts))
		if err != nil {
			return err
		}
		defer drop()
		version, syncCommit = v, sc
		servers = append(servers, fmt.Sprintf("PostgreSQL %s (synchronous_commit=%s)", version, syncCommit))
	}
	if withMySQL {
		addr, v, drop, err := setupMySQL(ctx)
		if err != nil {
			return err
		}
		defer drop()
		mysqlAddr, mysqlVersion = addr, v
		servers = append(servers, "MySQL "+v)
	}
	var report strings.Builder
	fmt.Fprintf(&report, "idem bench: %s, %d CPUs, Go %s, %s\n",
		time.Now().UTC().Format("2006-01-02"), runtime.NumCPU(), runtime.Version(), strings.Join(servers, ", "))
	fmt.Fprintf(&report, "%d interleaved rounds of %v per variant\n\n", rounds, duration)
	fmt.Print(report.String())

	for _, rtt := range rtts {
		l, err := openLatency(ctx, withPG, databaseURL, mysqlAddr, rtt, withRedis)
		if err != nil {
			return fmt.Errorf("-rtt %v: %w", rtt, err)
		}
		current = l
		head := fmt.Sprintf("network: %s\n\n", l.label())
		fmt.Print(head)
		report.WriteString(head)
		err = runSuites(ctx, l, suiteNames, workerCounts, rounds, duration, warmup, &report)
		current = &latency{redisAddr: "127.0.0.1:6379"}
		l.close()
		if err != nil {
			return err
		}
	}
	if jsonPath != "" {
		if err := writeJSON(jsonPath, version, syncCommit); err != nil {
			return err
		}
	}
	if chartPath != "" {
		write := writeChart
		if len(rtts) > 1 {
			write = writeLatencyChart
		}
		if err := write(chartPath); err != nil {
			return err
		}
	}
	if markdown != "" {
		return os.WriteFile(markdown, []byte(report.String()), 0o644)
	}
	return nil
}

// setupPostgres creates the bench's schema with idem's tables and the
// orders table on the server databaseURL names, and returns the server's
// version and synchronous_commit, and a function that drops the schema.
func setupPostgres(ctx context.Context, databaseURL string, maxConns int) (version, syncCommit string, drop func(), err error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return "", "", nil, err
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", "", nil, err
	}
	fail := func(err error) (string, string, func(), error) {
		pool.Close()
		return "", "", nil, err
	}
	if err := pool.Ping(ctx); err != nil {
		return fail(fmt.Errorf("cannot reach PostgreSQL (set DATABASE_URL): %w", err))
	}
	if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS idem_bench CASCADE`); err != nil {
		return fail(err)
	}
	drop = func() {
		pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS idem_bench CASCADE`) //nolint:errcheck
		pool.Close()
	}
	if err := migrations.Up(ctx, pool, migrations.WithTable(schema, idem.DefaultTable)); err != nil {
		drop()
		return "", "", nil, err
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE idem_bench.orders (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		user_id bigint NOT NULL, amount bigint NOT NULL, created_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		drop()
		return "", "", nil, err
	}
	_ = pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit')`).Scan(&version, &syncCommit)
	return version, syncCommit, drop, nil
}
