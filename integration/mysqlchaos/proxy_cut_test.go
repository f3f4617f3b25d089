//go:build chaos

package mysqlchaos_test

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/cutproxy"
)

// TestCommitCuts checks the soak's two faults one at a time: a COMMIT cut
// after it was forwarded commits, one cut before it does not, the client
// gets idem.ErrOutcomeUnknown from both, and Do with the same key settles
// each (a replay of the committed value, or a single run).
func TestCommitCuts(t *testing.T) {
	m := startMariaDB(t)
	direct := setUp(t, m)
	proxy, err := cutproxy.NewMySQL(m.addr())
	require.NoError(t, err)
	t.Cleanup(proxy.Close)
	db := workerDB(t, proxy.Addr(), false, 4)
	ctx := context.Background()

	count := func(key idem.Key) int {
		var n int
		require.NoError(t, direct.QueryRow(`SELECT COUNT(*) FROM effects WHERE scope = ? AND k = ?`, key.Scope, key.ID).Scan(&n))
		return n
	}
	// sessionsGone waits until the server has ended every session of the
	// workers' account: a cut session's COMMIT, or its rollback, is over.
	sessionsGone := func() {
		deadline := time.Now().Add(10 * time.Second)
		for {
			var n int
			require.NoError(t, direct.QueryRow(`SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE user = ?`, workerUser).Scan(&n))
			if n == 0 {
				return
			}
			require.True(t, time.Now().Before(deadline), "the workers' sessions did not end within 10s")
			time.Sleep(10 * time.Millisecond)
		}
	}
	do := func(key idem.Key) (idem.Result[string], *runLog, error) {
		runs := &runLog{}
		res, err := idemmysql.Do(ctx, db, key, func(ctx context.Context, tx *sql.Tx) (string, error) {
			return addEffect(ctx, tx, key, runs)
		})
		return res, runs, err
	}

	for _, tc := range []struct {
		name      string
		drop      float64
		committed int
	}{{"forwarded", 0, 1}, {"dropped", 1, 0}} {
		t.Run(tc.name, func(t *testing.T) {
			key := idem.Key{Scope: "cut", ID: tc.name}
			cuts, drops := proxy.Cuts(), proxy.Drops()
			proxy.SetDropRate(tc.drop)
			proxy.SetCutRate(1)
			_, runs, err := do(key)
			proxy.SetCutRate(0)
			require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			require.Equal(t, cuts+1, proxy.Cuts())
			require.Equal(t, drops+int64(tc.drop), proxy.Drops())
			require.Len(t, runs.values, 1)
			db.SetMaxIdleConns(0) // the pool's idle connections end too
			sessionsGone()
			db.SetMaxIdleConns(4)
			require.Equal(t, tc.committed, count(key), "effects after the cut")

			res, again, err := do(key)
			require.NoError(t, err)
			require.Equal(t, tc.committed == 1, res.Replayed, "replayed")
			if tc.committed == 1 {
				require.Equal(t, runs.values[0], res.Value, "the replay returns the committed value")
				require.Empty(t, again.values, "fn did not run again")
			} else {
				require.Len(t, again.values, 1, "fn ran once more")
				require.Equal(t, again.values[0], res.Value)
			}
			require.Equal(t, 1, count(key), "effects after the retry")
		})
	}
}
