package integration_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// A call whose record or inbox table does not exist says how to create it,
// and still carries the driver's error (SQLSTATE 42P01). A missing table of
// the caller's own, inside fn, is the caller's error and stays as it is.
func TestMissingTableSaysHowToCreateIt(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	missing := idem.WithTable(s.Name, "never_migrated")
	noInbox := idem.WithInboxTable(s.Name, "no_inbox")
	key := idem.Key{Scope: "s", ID: "k"}
	insert := func(ctx context.Context, tx pgx.Tx) (int, error) { return 1, nil }

	calls := map[string]func() error{
		"Do": func() error { _, err := idem.Do(ctx, pool, key, insert, missing); return err },
		"WithIdempotency": func() error {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck
			_, err = idem.WithIdempotency(ctx, tx, key, insert, missing)
			return err
		},
		"Claim":      func() error { _, _, err := idem.Claim[int](ctx, pool, key, time.Minute, missing); return err },
		"IssueToken": func() error { _, err := idem.IssueToken(ctx, pool, "s", time.Minute, missing); return err },
		"ConsumeOnce": func() error {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer tx.Rollback(ctx) //nolint:errcheck
			_, err = idem.ConsumeOnce(ctx, tx, "c", "m", func(context.Context, pgx.Tx) error { return nil }, noInbox)
			return err
		},
		"Purge": func() error { _, err := idem.Purge(ctx, pool, idem.PurgeParams{}, missing); return err },
		"Purge, inbox": func() error {
			_, err := idem.Purge(ctx, pool, idem.PurgeParams{InboxRetention: time.Hour}, s.Opt, noInbox)
			return err
		},
		"Lookup":       func() error { _, err := idem.Lookup(ctx, pool, "s", "k", missing); return err },
		"Stuck":        func() error { _, err := idem.Stuck(ctx, pool, 10, missing); return err },
		"CountExpired": func() error { _, _, err := idem.CountExpired(ctx, pool, 0, missing); return err },
		"TableStats":   func() error { _, err := idem.TableStats(ctx, pool, missing); return err },
	}
	for name, call := range calls {
		t.Run(name, func(t *testing.T) {
			err := call()
			require.Error(t, err)
			require.Contains(t, err.Error(), "migrations.Up", "the error says how to create the table")
			table := s.Name + ".never_migrated"
			if strings.Contains(name, "inbox") || name == "ConsumeOnce" {
				table = s.Name + ".no_inbox"
			}
			require.Contains(t, err.Error(), "table "+table+" does not exist")
			var pe *pgconn.PgError
			require.True(t, errors.As(err, &pe), "the driver's error is still there: %v", err)
			require.Equal(t, "42P01", pe.Code)
		})
	}

	// An idem call nested in fn explains its error once, not once per call.
	_, err := idem.Do(ctx, pool, idem.Key{Scope: "s", ID: "nested"}, func(ctx context.Context, tx pgx.Tx) (bool, error) {
		return idem.ConsumeOnce(ctx, tx, "c", "m", func(context.Context, pgx.Tx) error { return nil }, noInbox)
	}, s.Opt, noInbox)
	require.Error(t, err)
	require.Equal(t, 1, strings.Count(err.Error(), "create it with migrations.Up"), err.Error())

	// fn's own missing table is fn's error, unexplained.
	_, err = idem.Do(ctx, pool, idem.Key{Scope: "s", ID: "own"}, func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{s.Name, "orders_missing"}.Sanitize()+` VALUES (1)`)
		return 0, err
	}, s.Opt)
	require.Error(t, err)
	require.NotContains(t, err.Error(), "migrations.Up")
	var pe *pgconn.PgError
	require.True(t, errors.As(err, &pe))
	require.Equal(t, "42P01", pe.Code)
}
