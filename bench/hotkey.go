package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// hotKeyRequests is how many concurrent requests the hot-key suite sends
// with one key.
const hotKeyRequests = 1000

// runHotKeySuite sends hotKeyRequests concurrent Do calls with one key,
// through the pool (its size bounds the concurrency the database sees), and
// measures the time until every request is answered, in wait and no-wait
// modes; a no-wait request answered 409 retries after a short pause, as a
// client would, until it gets the result.
func runHotKeySuite(ctx context.Context, shared *pgxpool.Pool, workers, rounds int, _ time.Duration) (string, error) {
	// A pool of workers connections: the shared one is sized for the
	// largest worker count of the run.
	cfg := shared.Config().Copy()
	cfg.MaxConns = int32(workers)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return "", err
	}
	defer pool.Close()
	var t strings.Builder
	fmt.Fprintf(&t, "hotkey: %d concurrent requests with one key (pool of %d connections); time until every request is answered\n\n",
		hotKeyRequests, pool.Config().MaxConns)
	fmt.Fprintf(&t, "| mode | median | range | executions | 409 answers (median) |\n|---|---:|---|---:|---:|\n")
	for _, noWait := range []bool{false, true} {
		var times []time.Duration
		var conflicts []float64
		executions := 0
		for r := range rounds {
			key := idem.Key{Scope: "hot", ID: fmt.Sprintf("hot-%v-%d-%d", noWait, r, time.Now().UnixNano())}
			opts := []idem.DoOption{tableOpt}
			if noWait {
				opts = append(opts, idem.NoWait())
			}
			var (
				wg    sync.WaitGroup
				mu    sync.Mutex
				runs  int
				busy  int
				first error
			)
			start := make(chan struct{})
			began := time.Now()
			for range hotKeyRequests {
				wg.Go(func() {
					<-start
					for {
						_, err := idem.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (int64, error) {
							mu.Lock()
							runs++
							mu.Unlock()
							return insertRow(ctx, tx)
						}, opts...)
						if errors.Is(err, idem.ErrInProgress) {
							mu.Lock()
							busy++
							mu.Unlock()
							time.Sleep(10 * time.Millisecond)
							continue
						}
						if err != nil {
							mu.Lock()
							if first == nil {
								first = err
							}
							mu.Unlock()
						}
						return
					}
				})
			}
			close(start)
			wg.Wait()
			if first != nil {
				return "", first
			}
			times = append(times, time.Since(began))
			conflicts = append(conflicts, float64(busy))
			executions = max(executions, runs)
			fmt.Fprintf(os.Stderr, "  hotkey noWait=%v round %d/%d done\n", noWait, r+1, rounds)
		}
		mode := "wait"
		if noWait {
			mode = "no-wait (409, retry after 10ms)"
		}
		fmt.Fprintf(&t, "| %s | %v | %v-%v | %s | %.0f |\n", mode, medianDur(times).Round(time.Millisecond),
			slices.Min(times).Round(time.Millisecond), slices.Max(times).Round(time.Millisecond), strconv.Itoa(executions), median(conflicts))
	}
	t.WriteString("\n")
	return t.String(), nil
}
