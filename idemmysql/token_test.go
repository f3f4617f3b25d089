package idemmysql_test

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
)

// With RequireIssued only an issued token is accepted, each once: its first
// use runs, repeats and concurrent uses replay, a made-up or expired one is
// refused.
func TestIssuedTokens(t *testing.T) {
	claimReads(t, func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		token, err := idemmysql.IssueToken(ctx, db, "form", time.Hour)
		require.NoError(t, err)
		key := idem.Key{Scope: "form", ID: token}
		var runs atomic.Int32
		fn := func(ctx context.Context, tx *sql.Tx) (int, error) {
			n := int(runs.Add(1))
			return n, insertEffect(ctx, tx, token, n)
		}
		var wg sync.WaitGroup
		for range 10 {
			wg.Go(func() {
				res, err := idemmysql.Do(ctx, db, key, fn, idem.RequireIssued())
				require.NoError(t, err)
				require.Equal(t, 1, res.Value)
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, runs.Load())
		require.Equal(t, 1, effects(t, db, token))

		var te *idem.TokenError
		other, err := idemmysql.IssueToken(ctx, db, "form", time.Hour)
		require.NoError(t, err)
		forged := []byte(other) // another first character, same length
		if forged[0] == 'A' {
			forged[0] = 'B'
		} else {
			forged[0] = 'A'
		}
		_, err = idemmysql.Do(ctx, db, idem.Key{Scope: "form", ID: string(forged)}, fn, idem.RequireIssued())
		require.True(t, errors.As(err, &te) || errors.Is(err, idem.ErrInvalidKey), "%v", err)

		_, err = db.Exec(`UPDATE idempotent_record SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE idem_key = ?`, other)
		require.NoError(t, err)
		_, err = idemmysql.Do(ctx, db, idem.Key{Scope: "form", ID: other}, fn, idem.RequireIssued())
		require.ErrorAs(t, err, &te)
		require.EqualValues(t, 1, runs.Load())

		// In the caller's transaction too.
		third, err := idemmysql.IssueToken(ctx, db, "form", time.Hour)
		require.NoError(t, err)
		tx, err := db.Begin()
		require.NoError(t, err)
		res, err := idemmysql.WithIdempotency(ctx, tx, idem.Key{Scope: "form", ID: third}, fn, idem.RequireIssued())
		require.NoError(t, err)
		require.False(t, res.Replayed)
		require.NoError(t, tx.Commit())
	})
}
