package main

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// purgeRows is how many expired records the purge suite purges per round
// (-purge-rows).
var purgeRows int64 = 1_000_000

// purgeBatch is the purge suite's PurgeParams.BatchSize (-purge-batch);
// zero takes Purge's default. The report gives the size Purge used.
var purgeBatch = 0

// purgeRate is the purge suite's PurgeParams.RowsPerSecond (-purge-rate);
// zero purges as fast as it can.
var purgeRate = 250_000

// claimComplete is one lease-mode operation: Claim a new key, Complete it.
func claimComplete(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
	l, _, err := idem.Claim[int64](ctx, pool, key, time.Minute, tableOpt)
	if err != nil {
		return err
	}
	if l == nil {
		return fmt.Errorf("key %s was new but not claimed", key.ID)
	}
	return l.Complete(ctx, pool, 1)
}

// runPurgeSuite measures, per round: Claim+Complete alone (the baseline),
// then the same while Purge deletes purgeRows expired records, and reports
// the purge rate and the claims' p99 against the baseline's.
func runPurgeSuite(ctx context.Context, pool *pgxpool.Pool, workers, rounds int, duration time.Duration) (string, error) {
	rounds = min(rounds, 3) // each round re-creates the expired rows
	claims := variant{"Claim+Complete", claimComplete}
	var (
		baseTPS, loadTPS, rates, p99Ratios []float64
		baseP99, loadP99                   []time.Duration
		batch                              int64 // the largest batch Purge deleted
	)
	for r := range rounds {
		if _, err := pool.Exec(ctx, `INSERT INTO idem_bench.idempotent_record (scope, key, fingerprint, status, response, expires_at)
			SELECT 'expired', 'e' || g, '', 'succeeded', '1', clock_timestamp() - interval '1 hour'
			FROM generate_series(1, `+strconv.FormatInt(purgeRows, 10)+`) g`); err != nil {
			return "", err
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE idem_bench.idempotent_record`); err != nil {
			return "", err
		}
		base, err := measure(ctx, pool, claims, workers, duration)
		if err != nil {
			return "", err
		}
		// Claims run for as long as the purge does.
		var purged atomic.Int64
		var purgeErr error
		var purgeTime time.Duration
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			defer close(stop)
			started := time.Now()
			po := idem.PurgeParams{BatchSize: purgeBatch, RowsPerSecond: purgeRate, OnBatch: func(n int64) {
				batch = max(batch, n) // the batch size Purge used: the first batch is full
			}}
			n, err := idem.Purge(ctx, pool, po, tableOpt)
			purgeTime = time.Since(started)
			purged.Store(n)
			purgeErr = err
		})
		load, err := measureUntil(ctx, pool, claims, workers, stop)
		wg.Wait()
		if err != nil {
			return "", err
		}
		if purgeErr != nil {
			return "", purgeErr
		}
		if purged.Load() < purgeRows {
			return "", fmt.Errorf("purged %d rows, want at least %d", purged.Load(), purgeRows)
		}
		baseTPS = append(baseTPS, base.throughput())
		loadTPS = append(loadTPS, load.throughput())
		baseP99 = append(baseP99, base.p99)
		loadP99 = append(loadP99, load.p99)
		rates = append(rates, float64(purged.Load())/purgeTime.Seconds())
		p99Ratios = append(p99Ratios, float64(load.p99)/float64(base.p99))
		fmt.Fprintf(os.Stderr, "  purge workers=%d round %d/%d done\n", workers, r+1, rounds)
	}
	var t strings.Builder
	pacing := "unpaced"
	if purgeRate > 0 {
		pacing = fmt.Sprintf("paced at %d rows/s", purgeRate)
	}
	fmt.Fprintf(&t, "purge: Purge of %d expired records (batches of %d, %s) while %d workers Claim and Complete new keys; %d rounds\n\n",
		purgeRows, batch, pacing, workers, rounds)
	fmt.Fprintf(&t, "| measure | median | range |\n|---|---:|---|\n")
	fmt.Fprintf(&t, "| Claim+Complete ops/s, alone | %.0f | %.0f-%.0f |\n", median(baseTPS), slices.Min(baseTPS), slices.Max(baseTPS))
	fmt.Fprintf(&t, "| Claim+Complete ops/s, during the purge | %.0f | %.0f-%.0f |\n", median(loadTPS), slices.Min(loadTPS), slices.Max(loadTPS))
	fmt.Fprintf(&t, "| Claim+Complete p99, alone | %v | %v-%v |\n", medianDur(baseP99).Round(10*time.Microsecond),
		slices.Min(baseP99).Round(10*time.Microsecond), slices.Max(baseP99).Round(10*time.Microsecond))
	fmt.Fprintf(&t, "| Claim+Complete p99, during the purge | %v | %v-%v |\n", medianDur(loadP99).Round(10*time.Microsecond),
		slices.Min(loadP99).Round(10*time.Microsecond), slices.Max(loadP99).Round(10*time.Microsecond))
	fmt.Fprintf(&t, "| p99 during / alone | %.2f | %.2f-%.2f |\n", median(p99Ratios), slices.Min(p99Ratios), slices.Max(p99Ratios))
	fmt.Fprintf(&t, "| purge rate, rows/s | %.0f | %.0f-%.0f |\n\n", median(rates), slices.Min(rates), slices.Max(rates))
	return t.String(), nil
}

// measureUntil runs v with workers, each with a new key per operation, until
// stop is closed.
func measureUntil(ctx context.Context, pool *pgxpool.Pool, v variant, workers int, stop <-chan struct{}) (sample, error) {
	var (
		wg       sync.WaitGroup
		ops      atomic.Int64
		mu       sync.Mutex
		lat      []time.Duration
		firstErr error
	)
	start := time.Now()
	cpu0, proxy0 := processCPU(), current.proxyCPU()
	for range workers {
		wg.Go(func() {
			local := make([]time.Duration, 0, 4096)
			defer func() {
				mu.Lock()
				lat = append(lat, local...)
				mu.Unlock()
			}()
			for {
				select {
				case <-stop:
					return
				default:
				}
				key := nextKey()
				t0 := time.Now()
				if err := v.op(ctx, pool, key); err != nil {
					mu.Lock()
					firstErr = cmp.Or(firstErr, err)
					mu.Unlock()
					return
				}
				local = append(local, time.Since(t0))
				ops.Add(1)
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return sample{}, firstErr
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(p*float64(len(lat))))]
	}
	return sample{ops: ops.Load(), elapsed: time.Since(start), p50: pct(0.50), p99: pct(0.99), cpu: processCPU() - cpu0,
		proxyCPU: current.proxyCPU() - proxy0}, nil
}
