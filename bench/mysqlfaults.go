package main

import (
	"context"
	"database/sql"
	"io"
	"log"
	"os"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/cutproxy"
)

// runMySQLFaultSuite is the fault suite on MySQL: faultRequests sign-ups
// through the recipe as written (its transaction on MySQL) and through
// idemmysql.Do, over connections that a proxy cuts right after a share
// faultRate of the COMMITs, the recipe losing as many of its Redis writes
// after the commit; clients retry with the same key.
func runMySQLFaultSuite(ctx context.Context, _ *pgxpool.Pool, workers, _ int, _ time.Duration) (string, error) {
	if err := openRedis(ctx, "mysql-faults"); err != nil {
		return "", err
	}
	// go-sql-driver logs every connection the proxy cuts.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	defer mysql.SetLogger(log.New(os.Stderr, "[mysql] ", log.Ldate|log.Ltime|log.Lshortfile)) //nolint:errcheck
	proxy, err := cutproxy.NewMySQL(current.mysqlAddr)
	if err != nil {
		return "", err
	}
	defer proxy.Close()
	proxy.SetCutRate(faultRate)
	cut, st, err := openMySQLPool(ctx, proxy.Addr(), workers)
	if err != nil {
		return "", err
	}
	defer cut.Close()
	defer st.close()
	var redisFaults atomic.Int64
	systems := []faultSystem{
		{"redis recipe", func(ctx context.Context, user int64, key string) error {
			return runRecipe(ctx, signupMySQL(cut, st, user), user, key, true, loseRedis(&redisFaults))
		}},
		{"idemmysql Do", func(ctx context.Context, user int64, key string) error {
			_, err := idemmysql.Do(ctx, cut, idem.Key{Scope: "faults", ID: key}, func(ctx context.Context, tx *sql.Tx) (int64, error) {
				return insertSignupMySQL(ctx, tx, st, user)
			})
			return err
		}},
	}
	count := func(ctx context.Context, first, last int64) (map[int64]int, error) {
		rows := map[int64]int{}
		r, err := mysqlDB.QueryContext(ctx, `SELECT user_id, COUNT(*) FROM signups WHERE user_id BETWEEN ? AND ? GROUP BY user_id`, first, last)
		if err != nil {
			return nil, err
		}
		defer r.Close()
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
	return faultTable(ctx, "mysql-faults", systems, workers, proxy.Cuts, &redisFaults, count)
}
