package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
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

// doRandomKeyIn returns Do with a random 128-bit key, as clients make them,
// against the record table named table in the bench schema, so that claims
// land all over the primary key instead of at its right edge.
func doRandomKeyIn(table string) func(ctx context.Context, pool *pgxpool.Pool, _ idem.Key) error {
	opt := idem.WithTable(schema, table)
	return func(ctx context.Context, pool *pgxpool.Pool, _ idem.Key) error {
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		_, err := idem.Do(ctx, pool, idem.Key{Scope: "bench", ID: hex.EncodeToString(b)}, insertRow, opt)
		return err
	}
}

// sizeTable is the record table the tablesize suite fills with size records.
func sizeTable(size int64) string { return "record_" + strconv.FormatInt(size, 10) }

// runTableSizeSuite measures Do with random keys against record tables that
// already hold each of tableSizes records (random keys too), one table per
// size, in interleaved rounds whose order rotates; a round's ratio is each
// size's throughput over the empty table's in that round. It reports the
// process's peak memory too. The empty table is emptied before each of its
// measurements; the others keep the few rows each round adds.
func runTableSizeSuite(ctx context.Context, pool *pgxpool.Pool, workers, rounds int, duration time.Duration) (string, error) {
	sizes := slices.Clone(tableSizes)
	if !slices.Contains(sizes, 0) {
		sizes = append([]int64{0}, sizes...) // the baseline
	}
	slices.Sort(sizes)
	sizes = slices.Compact(sizes)
	var reloptions string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_to_string(reloptions, ', '), '') FROM pg_class
		WHERE oid = 'idem_bench.idempotent_record'::regclass`).Scan(&reloptions); err != nil {
		return "", err
	}
	with := ""
	if reloptions != "" {
		with = " WITH (" + reloptions + ")"
	}
	for _, size := range sizes {
		t := schema + "." + sizeTable(size)
		// A copy of the migrated table: columns, defaults, checks, indexes
		// and storage parameters (fillfactor).
		if _, err := pool.Exec(ctx, `CREATE TABLE `+t+` (LIKE idem_bench.idempotent_record INCLUDING ALL)`+with); err != nil {
			return "", err
		}
		defer pool.Exec(context.Background(), `DROP TABLE IF EXISTS `+t) //nolint:errcheck
		// Filled in steps of 1M, with random keys.
		for have := int64(0); have < size; {
			step := min(size-have, 1_000_000)
			if _, err := pool.Exec(ctx, `INSERT INTO `+t+` (scope, key, fingerprint, status, response, expires_at)
				SELECT 'bench', md5(random()::text || g::text), '', 'succeeded', '"1"', clock_timestamp() + interval '1 day'
				FROM generate_series(1, `+strconv.FormatInt(step, 10)+`) g`); err != nil {
				return "", err
			}
			have += step
			fmt.Fprintf(os.Stderr, "  tablesize: %s holds %d records\n", t, have)
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+t); err != nil {
			return "", err
		}
	}

	for _, size := range sizes { // warm the pool, the statement caches and each table's pages
		v := variant{"warm-up", doRandomKeyIn(sizeTable(size))}
		if _, err := measure(ctx, pool, v, workers, min(duration, time.Second)); err != nil {
			return "", err
		}
	}
	tps := make(map[int64][]float64)
	ratios := make(map[int64][]float64)
	p99s := make(map[int64][]time.Duration)
	for r := range rounds {
		round := make(map[int64]float64)
		for i := range sizes {
			size := sizes[(i+r)%len(sizes)]
			if size == 0 {
				if _, err := pool.Exec(ctx, `TRUNCATE `+schema+`.`+sizeTable(0)); err != nil {
					return "", err
				}
			}
			v := variant{fmt.Sprintf("Do, random keys, %d records", size), doRandomKeyIn(sizeTable(size))}
			s, err := measure(ctx, pool, v, workers, duration)
			if err != nil {
				return "", err
			}
			round[size] = s.throughput()
			tps[size] = append(tps[size], s.throughput())
			p99s[size] = append(p99s[size], s.p99)
		}
		for _, size := range sizes {
			ratios[size] = append(ratios[size], round[size]/round[0])
		}
		fmt.Fprintf(os.Stderr, "  tablesize round %d/%d done\n", r+1, rounds)
	}

	var t strings.Builder
	fmt.Fprintf(&t, "tablesize: Do with random keys, %d workers, against record tables of each size, %d interleaved rounds\n\n", workers, rounds)
	t.WriteString("| existing records | ops/s (median) | ratio to empty (median of rounds) | ratio range | p99 | table + indexes |\n|---:|---:|---:|---|---:|---:|\n")
	for _, size := range sizes {
		var bytes string
		_ = pool.QueryRow(ctx, `SELECT pg_size_pretty(pg_total_relation_size($1::regclass))`, schema+"."+sizeTable(size)).Scan(&bytes)
		fmt.Fprintf(&t, "| %d | %.0f | %.2f | %.2f-%.2f | %v | %s |\n", size, median(tps[size]), median(ratios[size]),
			slices.Min(ratios[size]), slices.Max(ratios[size]), medianDur(p99s[size]).Round(10*time.Microsecond), bytes)
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	fmt.Fprintf(&t, "\nPeak resident memory of the bench process: %d MiB.\n\n", ru.Maxrss/1024)
	return t.String(), nil
}
