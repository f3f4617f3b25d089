package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/cutproxy"
)

// faultRequests is how many sign-ups each system takes in the fault suite,
// and faultRate the share of COMMITs whose connection is cut (and, for the
// recipe, of Redis writes that are lost after the commit).
var (
	faultRequests = 2000
	faultRate     = 0.05
)

// faultOutcome is what happened to one sign-up, after the client's retries.
type faultOutcome int

const (
	outcomeOK faultOutcome = iota
	outcomeStuck
	outcomeError
)

// runFaultSuite runs faultRequests sign-ups through the Redis recipe and
// through Do over connections that a proxy cuts right after COMMIT, and
// counts what went wrong once the clients (retrying with the same key, up to
// 10 times) gave up or succeeded.
func runFaultSuite(ctx context.Context, pool *pgxpool.Pool, workers, _ int, _ time.Duration) (string, error) {
	if err := setupRedis(ctx, pool); err != nil {
		return "", err
	}
	cfg := pool.Config().Copy()
	proxy, err := cutproxy.New(cfg.ConnString())
	if err != nil {
		return "", err
	}
	defer proxy.Close()
	proxy.SetCutRate(faultRate)
	host, port, err := net.SplitHostPort(proxy.Addr())
	if err != nil {
		return "", err
	}
	portNum, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", err
	}
	cfg.ConnConfig.Host, cfg.ConnConfig.Port = host, uint16(portNum)
	cfg.ConnConfig.Fallbacks = nil
	cut, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer cut.Close()

	var redisFaults atomic.Int64
	systems := []faultSystem{
		{"redis recipe", func(ctx context.Context, user int64, key string) error {
			return recipeOnce(ctx, cut, user, key, &redisFaults)
		}},
		{"idem Do", func(ctx context.Context, user int64, key string) error {
			_, err := idem.Do(ctx, cut, idem.Key{Scope: "faults", ID: key}, func(ctx context.Context, tx pgx.Tx) (int64, error) {
				return insertSignup(ctx, tx, user)
			}, tableOpt)
			return err
		}},
	}
	count := func(ctx context.Context, first, last int64) (map[int64]int, error) {
		rows := map[int64]int{}
		r, err := pool.Query(ctx, `SELECT user_id, count(*) FROM idem_bench.signups WHERE user_id BETWEEN $1 AND $2 GROUP BY user_id`, first, last)
		if err != nil {
			return nil, err
		}
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
	return faultTable(ctx, "faults", systems, workers, proxy.Cuts, &redisFaults, count)
}

// faultSystem is one of the systems the fault suites compare: submit makes
// one attempt at user's sign-up with key.
type faultSystem struct {
	name   string
	submit func(ctx context.Context, user int64, key string) error
}

// faultTable sends faultRequests sign-ups through each system with workers
// workers, each client retrying with the same key (up to 10 times, 20 ms
// apart), and counts what went wrong once they gave up or succeeded. cuts
// is the number of COMMITs cut so far, redisFaults the Redis writes the
// systems lost (reset per system), and count the committed rows of each
// user from first to last.
func faultTable(ctx context.Context, suite string, systems []faultSystem, workers int, cuts func() int64, redisFaults *atomic.Int64,
	count func(ctx context.Context, first, last int64) (map[int64]int, error)) (string, error) {
	var t strings.Builder
	fmt.Fprintf(&t, "%s: %d sign-ups per system, %d workers; %.0f%% of COMMITs have their connection cut right after they are sent (and, for the recipe, %.0f%% of its Redis writes after the commit are lost); clients retry with the same key up to 10 times\n\n",
		suite, faultRequests, workers, faultRate*100, faultRate*100)
	fmt.Fprintf(&t, "| system | cuts injected | duplicate effects | stuck keys | errors although committed | lost acknowledged writes |\n|---|---:|---:|---:|---:|---:|\n")
	for _, sys := range systems {
		cutsBefore := cuts()
		redisFaults.Store(0)
		first := signupUser.Load() + 1
		outcomes := make([]faultOutcome, faultRequests)
		jobs := make(chan int)
		var wg sync.WaitGroup
		for range workers {
			wg.Go(func() {
				for i := range jobs {
					user := first + int64(i)
					key := fmt.Sprintf("%s-%d-%d", redisRun, user, i)
					outcomes[i] = outcomeError
					for attempt := 0; attempt < 10; attempt++ {
						err := sys.submit(ctx, user, key)
						if err == nil {
							outcomes[i] = outcomeOK
							break
						}
						if errors.Is(err, errRecipeInProgress) || errors.Is(err, idem.ErrInProgress) {
							outcomes[i] = outcomeStuck
						} else {
							outcomes[i] = outcomeError
						}
						time.Sleep(20 * time.Millisecond)
					}
				}
			})
		}
		for i := range faultRequests {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		signupUser.Add(int64(faultRequests))

		rows, err := count(ctx, first, first+int64(faultRequests)-1)
		if err != nil {
			return "", err
		}
		var dup, stuck, wrongErr, lost int
		for i, o := range outcomes {
			n := rows[first+int64(i)]
			if n > 1 {
				dup += n - 1
			}
			switch {
			case o == outcomeOK && n == 0:
				lost++
			case o == outcomeStuck:
				stuck++
			case o == outcomeError && n > 0:
				wrongErr++
			}
		}
		fmt.Fprintf(&t, "| %s | %d | %d | %d | %d | %d |\n", sys.name, cuts()-cutsBefore+redisFaults.Load(), dup, stuck, wrongErr, lost)
		fmt.Fprintf(os.Stderr, "  %s: %s done\n", suite, sys.name)
	}
	t.WriteString("\nThe recipe's table keeps its unique index, as the scenario has it, so neither system stores a duplicate; the recipe pays instead with keys stuck in PROCESSING until their TTL (a Redis write lost after the commit) and retries refused by the unique index although the first attempt committed (a COMMIT whose answer was lost, then DEL and a fresh claim). idem's retries replay.\n\n")
	return t.String(), nil
}

// recipeOnce is the recipe with a share faultRate of its post-commit Redis
// writes lost.
func recipeOnce(ctx context.Context, pool *pgxpool.Pool, user int64, key string, redisFaults *atomic.Int64) error {
	return recipe(ctx, pool, user, key, loseRedis(redisFaults))
}

// loseRedis is the fault suites' injection into the recipe: it loses the
// connection to Redis after a share faultRate of the commits, counted in
// redisFaults.
func loseRedis(redisFaults *atomic.Int64) func() bool {
	return func() bool {
		if rand.Float64() < faultRate {
			redisFaults.Add(1)
			return true
		}
		return false
	}
}
