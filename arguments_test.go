package idem_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// noSQL is a database, a transaction and a transaction starter that fails
// the test when it is asked to run anything.
type noSQL struct{ t *testing.T }

var (
	_ idem.DBTX       = noSQL{}
	_ idem.TxBeginner = noSQL{}
	_ pgx.Tx          = noSQL{}
)

func (n noSQL) fail(what, sql string) {
	n.t.Helper()
	n.t.Errorf("%s ran before the arguments were refused: %s", what, sql)
}

func (n noSQL) Begin(context.Context) (pgx.Tx, error) {
	n.fail("Begin", "BEGIN")
	return nil, context.Canceled
}

func (n noSQL) Exec(_ context.Context, sql string, _ ...any) (pgconn.CommandTag, error) {
	n.fail("Exec", sql)
	return pgconn.CommandTag{}, context.Canceled
}

func (n noSQL) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	n.fail("Query", sql)
	return nil, context.Canceled
}

func (n noSQL) QueryRow(_ context.Context, sql string, _ ...any) pgx.Row {
	n.fail("QueryRow", sql)
	return errRow{}
}

func (n noSQL) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	n.fail("SendBatch", "a batch")
	return nil
}

func (n noSQL) Commit(context.Context) error   { n.fail("Commit", "COMMIT"); return nil }
func (n noSQL) Rollback(context.Context) error { n.fail("Rollback", "ROLLBACK"); return nil }
func (n noSQL) Conn() *pgx.Conn                { return nil }

func (n noSQL) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	n.fail("CopyFrom", "COPY")
	return 0, context.Canceled
}

func (n noSQL) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

func (n noSQL) Prepare(_ context.Context, _, sql string) (*pgconn.StatementDescription, error) {
	n.fail("Prepare", sql)
	return nil, context.Canceled
}

type errRow struct{}

func (errRow) Scan(...any) error { return context.Canceled }

// Every entry point refuses a malformed key, a missing database or function
// and an unusable option before it runs any SQL.
func TestEntryPointsCheckArgumentsBeforeSQL(t *testing.T) {
	t.Parallel()

	ctx := context.Background()
	db := noSQL{t}
	key := idem.Key{Scope: "user:1", ID: "k"}
	badKey := idem.Key{Scope: "user:1", ID: "a\x00"}
	fn := func(context.Context, pgx.Tx) (int, error) {
		t.Error("fn ran")
		return 0, nil
	}
	consume := func(context.Context, pgx.Tx) error {
		t.Error("fn ran")
		return nil
	}
	badTable := idem.WithTable("", "no-dashes")

	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"WithIdempotency bad key", func() error { _, err := idem.WithIdempotency(ctx, db, badKey, fn); return err }, idem.ErrInvalidKey},
		{"WithIdempotency nil tx", func() error { _, err := idem.WithIdempotency(ctx, nil, key, fn); return err }, idem.ErrInvalidOption},
		{"WithIdempotency nil fn", func() error { _, err := idem.WithIdempotency[int](ctx, db, key, nil); return err }, idem.ErrInvalidOption},
		{"WithIdempotency bad option", func() error { _, err := idem.WithIdempotency(ctx, db, key, fn, badTable); return err }, idem.ErrInvalidOption},
		{"WithIdempotency made-up token", func() error {
			_, err := idem.WithIdempotency(ctx, db, key, fn, idem.RequireIssued())
			return err
		}, idem.ErrTokenRejected},

		{"Do bad key", func() error { _, err := idem.Do(ctx, db, badKey, fn); return err }, idem.ErrInvalidKey},
		{"Do nil db", func() error { _, err := idem.Do(ctx, nil, key, fn); return err }, idem.ErrInvalidOption},
		{"Do nil fn", func() error { _, err := idem.Do[int](ctx, db, key, nil); return err }, idem.ErrInvalidOption},
		{"Do zero TTL", func() error { _, err := idem.Do(ctx, db, key, fn, idem.WithTTL(0)); return err }, idem.ErrInvalidOption},
		{"Do made-up token", func() error { _, err := idem.Do(ctx, db, key, fn, idem.RequireIssued()); return err }, idem.ErrTokenRejected},

		{"Claim bad key", func() error { _, _, err := idem.Claim[int](ctx, db, badKey, time.Minute); return err }, idem.ErrInvalidKey},
		{"Claim nil db", func() error { _, _, err := idem.Claim[int](ctx, nil, key, time.Minute); return err }, idem.ErrInvalidOption},
		{"Claim zero lease", func() error { _, _, err := idem.Claim[int](ctx, db, key, 0); return err }, idem.ErrInvalidOption},
		{"Claim bad option", func() error { _, _, err := idem.Claim[int](ctx, db, key, time.Minute, badTable); return err }, idem.ErrInvalidOption},

		{"ConsumeOnce empty consumer", func() error { _, err := idem.ConsumeOnce(ctx, db, "", "m-1", consume); return err }, idem.ErrInvalidKey},
		{"ConsumeOnce long message ID", func() error {
			_, err := idem.ConsumeOnce(ctx, db, "c", strings.Repeat("m", 256), consume)
			return err
		}, idem.ErrInvalidKey},
		{"ConsumeOnce nil tx", func() error { _, err := idem.ConsumeOnce(ctx, nil, "c", "m-1", consume); return err }, idem.ErrInvalidOption},
		{"ConsumeOnce nil fn", func() error { _, err := idem.ConsumeOnce(ctx, db, "c", "m-1", nil); return err }, idem.ErrInvalidOption},
		{"ConsumeOnce bad inbox table", func() error {
			_, err := idem.ConsumeOnce(ctx, db, "c", "m-1", consume, idem.WithInboxTable("", "1inbox"))
			return err
		}, idem.ErrInvalidOption},

		{"IssueToken bad scope", func() error { _, err := idem.IssueToken(ctx, db, "", time.Minute); return err }, idem.ErrInvalidKey},
		{"IssueToken nil db", func() error { _, err := idem.IssueToken(ctx, nil, "s", time.Minute); return err }, idem.ErrInvalidOption},
		{"IssueToken zero TTL", func() error { _, err := idem.IssueToken(ctx, db, "s", 0); return err }, idem.ErrInvalidOption},

		{"Purge nil db", func() error { _, err := idem.Purge(ctx, nil, idem.PurgeParams{}); return err }, idem.ErrInvalidOption},
		{"Purge negative batch", func() error { _, err := idem.Purge(ctx, db, idem.PurgeParams{BatchSize: -1}); return err }, idem.ErrInvalidOption},
		{"Purge negative rate", func() error { _, err := idem.Purge(ctx, db, idem.PurgeParams{RowsPerSecond: -1}); return err }, idem.ErrInvalidOption},
		{"Purge negative retention", func() error {
			_, err := idem.Purge(ctx, db, idem.PurgeParams{InboxRetention: -time.Second})
			return err
		}, idem.ErrInvalidOption},
		{"Purge bad option", func() error { _, err := idem.Purge(ctx, db, idem.PurgeParams{}, badTable); return err }, idem.ErrInvalidOption},
		{"Purge bad inbox table", func() error {
			_, err := idem.Purge(ctx, db, idem.PurgeParams{InboxRetention: time.Hour}, idem.WithInboxTable("", "1inbox"))
			return err
		}, idem.ErrInvalidOption},
		{"Purge negative retry", func() error {
			_, err := idem.Purge(ctx, db, idem.PurgeParams{Retry: idem.RetryPolicy{MaxAttempts: -1}})
			return err
		}, idem.ErrInvalidOption},
		{"Purger without DB", func() error { return (&idem.Purger{}).Run(ctx) }, idem.ErrInvalidOption},
		{"Purger negative interval", func() error { return (&idem.Purger{DB: db, Interval: -1}).Run(ctx) }, idem.ErrInvalidOption},

		{"Lookup nil db", func() error { _, err := idem.Lookup(ctx, nil, "s", "k"); return err }, idem.ErrInvalidOption},
		{"Lookup bad id", func() error { _, err := idem.Lookup(ctx, db, "s", ""); return err }, idem.ErrInvalidKey},
		{"Stuck zero limit", func() error { _, err := idem.Stuck(ctx, db, 0); return err }, idem.ErrInvalidOption},
		{"CountExpired negative retention", func() error { _, _, err := idem.CountExpired(ctx, db, -1); return err }, idem.ErrInvalidOption},

		{"InsertOrGet no lookup", func() error {
			_, err := idem.InsertOrGet(ctx, db, idem.Query{SQL: "INSERT ..."}, idem.Query{})
			return err
		}, idem.ErrInvalidOption},
	}
	for _, tt := range tests {
		require.ErrorIs(t, tt.call(), tt.want, tt.name)
	}
}
