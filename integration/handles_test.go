package integration_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// A transaction the caller already committed or rolled back is answered,
// by every call that works in the caller's transaction and through every
// driver, with an ErrInvalidOption that says so; fn does not run.
func TestEndedTransactionIsRefused(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	for _, d := range sqlDrivers {
		e := &sqlEnv{driver: d, pool: pool, s: s, db: d.open(t, pgtest.ClientURL(), 2)}
		for _, end := range []string{"Commit", "Rollback"} {
			t.Run(d.name+"/"+end, func(t *testing.T) {
				tx, err := e.begin(ctx, "")
				require.NoError(t, err)
				if end == "Commit" {
					require.NoError(t, tx.Commit(ctx))
				} else {
					require.NoError(t, tx.Rollback(ctx))
				}
				key := newKey(t)
				ran := false
				_, err = envWith(ctx, tx, key, func(context.Context, stx) (int, error) {
					ran = true
					return 1, nil
				}, s.Opt)
				require.ErrorIs(t, err, idem.ErrInvalidOption)
				require.ErrorContains(t, err, "idem: WithIdempotency: the transaction was already committed or rolled back")

				var n int
				if tx.pgx != nil {
					_, err = idem.ConsumeOnce(ctx, tx.pgx, "c", key.ID, func(context.Context, pgx.Tx) error {
						ran = true
						return nil
					}, s.Opt)
				} else {
					_, err = idemsql.ConsumeOnce(ctx, tx.sql, "c", key.ID, func(context.Context, *sql.Tx) error {
						ran = true
						return nil
					}, s.Opt)
				}
				require.ErrorIs(t, err, idem.ErrInvalidOption)
				require.ErrorContains(t, err, "already committed or rolled back")

				if tx.pgx != nil {
					_, err = idem.InsertOrGetTx(ctx, tx.pgx, idem.Query{SQL: "SELECT 1"}, idem.Query{SQL: "SELECT 1"}, &n)
				} else {
					_, err = idemsql.InsertOrGetTx(ctx, tx.sql, idem.Query{SQL: "SELECT 1"}, idem.Query{SQL: "SELECT 1"}, &n)
				}
				require.ErrorIs(t, err, idem.ErrInvalidOption)
				require.ErrorContains(t, err, "already committed or rolled back")
				require.False(t, ran, "fn ran")
				require.Nil(t, s.ReadRecord(t, pool, key))
			})
		}
	}
}
