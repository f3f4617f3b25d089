package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// tableSizes are the record counts the tablesize suite measures at
// (-table-sizes).
var tableSizes = []int64{0, 1_000_000, 10_000_000}

// doRandomKey is Do with a random 128-bit key, as clients make them, so that
// claims land all over the primary key instead of at its right edge.
func doRandomKey(ctx context.Context, pool *pgxpool.Pool, _ idem.Key) error {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	_, err := idem.Do(ctx, pool, idem.Key{Scope: "bench", ID: hex.EncodeToString(b)}, insertRow, tableOpt)
	return err
}

// runTableSizeSuite measures Do with random keys against a record table that
// already holds each of tableSizes records (random keys too), and reports
// throughput against the empty table and the process's peak memory.
func runTableSizeSuite(ctx context.Context, pool *pgxpool.Pool, workers, rounds int, duration time.Duration) (string, error) {
	v := variant{"Do, random keys", doRandomKey}
	if _, err := pool.Exec(ctx, `TRUNCATE idem_bench.idempotent_record`); err != nil {
		return "", err
	}
	// Leave the table empty for the suites that follow.
	defer pool.Exec(context.Background(), `TRUNCATE idem_bench.idempotent_record`) //nolint:errcheck
	var t strings.Builder
	fmt.Fprintf(&t, "tablesize: Do with random keys, %d workers, against a record table of growing size (target at 10M: >= 0.8x empty)\n\n", workers)
	fmt.Fprintf(&t, "| existing records | ops/s (median of %d) | ratio to empty | p99 | table + indexes |\n|---:|---:|---:|---:|---:|\n", rounds)
	var have int64
	var base float64
	for _, size := range tableSizes {
		for have < size { // grow in steps of 1M, random keys
			step := min(size-have, 1_000_000)
			if _, err := pool.Exec(ctx, `INSERT INTO idem_bench.idempotent_record (scope, key, fingerprint, status, response, expires_at)
				SELECT 'bench', md5(random()::text || g::text), '', 'succeeded', '"1"', clock_timestamp() + interval '1 day'
				FROM generate_series(1, `+strconv.FormatInt(step, 10)+`) g`); err != nil {
				return "", err
			}
			have += step
			fmt.Fprintf(os.Stderr, "  tablesize: %d records\n", have)
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE idem_bench.idempotent_record`); err != nil {
			return "", err
		}
		var tps []float64
		var p99s []time.Duration
		for range rounds {
			s, err := measure(ctx, pool, v, workers, duration)
			if err != nil {
				return "", err
			}
			tps = append(tps, s.throughput())
			p99s = append(p99s, s.p99)
		}
		m := median(tps)
		if size == 0 || base == 0 {
			base = m
		}
		var bytes string
		_ = pool.QueryRow(ctx, `SELECT pg_size_pretty(pg_total_relation_size('idem_bench.idempotent_record'))`).Scan(&bytes)
		fmt.Fprintf(&t, "| %d | %.0f | %.2f | %v | %s |\n", size, m, m/base, medianDur(p99s).Round(10*time.Microsecond), bytes)
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Fprintf(&t, "\nPeak resident memory of the bench process: %d MiB.\n\n", ru.Maxrss/1024)
	return t.String(), nil
}
