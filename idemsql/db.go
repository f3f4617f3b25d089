package idemsql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemkit/idem"
)

// DB adapts a *sql.DB to idem: it satisfies idem.TxBeginner (with BeginTx,
// so that idem.WithTxOptions works) and idem.DBTX. Statements outside a
// transaction run on any of the pool's connections, as they do on a
// *pgxpool.Pool. A DB is safe for concurrent use. Create it with Wrap.
type DB struct {
	db *sql.DB
}

// Wrap returns db adapted to idem. The adapter holds no state of its own:
// wrapping the same *sql.DB twice gives equivalent values, and closing db is
// left to the caller. Wrap(nil) returns nil, which every idem call refuses
// with idem.ErrInvalidOption before any SQL.
func Wrap(db *sql.DB) *DB {
	if db == nil {
		return nil
	}
	return &DB{db: db}
}

// SQL returns the wrapped *sql.DB.
func (d *DB) SQL() *sql.DB {
	if d == nil {
		return nil
	}
	return d.db
}

// Begin begins a transaction with the driver's defaults (READ COMMITTED
// unless the server is configured otherwise). ctx bounds the whole
// transaction: when it ends before Commit, database/sql rolls the
// transaction back.
func (d *DB) Begin(ctx context.Context) (pgx.Tx, error) {
	return d.BeginTx(ctx, pgx.TxOptions{})
}

// BeginTx begins a transaction with opts: IsoLevel and AccessMode become
// sql.TxOptions, DeferrableMode a SET TRANSACTION statement right after the
// begin. BeginQuery and CommitQuery are not supported and return an error.
// ctx bounds the whole transaction, as for Begin.
func (d *DB) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	if d == nil {
		return nil, fmt.Errorf("%w: idemsql: a nil *DB (Wrap(nil)) cannot begin a transaction", idem.ErrInvalidOption)
	}
	sopts, setTx, err := sqlTxOptions(opts)
	if err != nil {
		return nil, err
	}
	stx, err := d.db.BeginTx(ctx, &sopts)
	if err != nil {
		return nil, err
	}
	if setTx != "" {
		if _, err := stx.ExecContext(ctx, setTx); err != nil {
			_ = stx.Rollback()
			return nil, err
		}
	}
	t := newTx(stx)
	t.ctx = ctx
	return t, nil
}

// sqlTxOptions maps pgx's transaction options to database/sql's, with the
// statement that sets what sql.TxOptions cannot express.
func sqlTxOptions(opts pgx.TxOptions) (sql.TxOptions, string, error) {
	var s sql.TxOptions
	if opts.BeginQuery != "" || opts.CommitQuery != "" {
		return s, "", fmt.Errorf("idemsql: TxOptions.BeginQuery and CommitQuery are not supported through database/sql")
	}
	switch opts.IsoLevel {
	case "":
		s.Isolation = sql.LevelDefault
	case pgx.Serializable:
		s.Isolation = sql.LevelSerializable
	case pgx.RepeatableRead:
		s.Isolation = sql.LevelRepeatableRead
	case pgx.ReadCommitted:
		s.Isolation = sql.LevelReadCommitted
	case pgx.ReadUncommitted:
		s.Isolation = sql.LevelReadUncommitted
	default:
		return s, "", fmt.Errorf("idemsql: unknown isolation level %q", opts.IsoLevel)
	}
	switch opts.AccessMode {
	case "", pgx.ReadWrite:
	case pgx.ReadOnly:
		s.ReadOnly = true
	default:
		return s, "", fmt.Errorf("idemsql: unknown access mode %q", opts.AccessMode)
	}
	switch opts.DeferrableMode {
	case "":
		return s, "", nil
	case pgx.Deferrable:
		return s, "SET TRANSACTION DEFERRABLE", nil
	case pgx.NotDeferrable:
		return s, "SET TRANSACTION NOT DEFERRABLE", nil
	default:
		return s, "", fmt.Errorf("idemsql: unknown deferrable mode %q", opts.DeferrableMode)
	}
}

// Exec runs sql on one of the pool's connections, outside any transaction.
func (d *DB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return execOn(ctx, d.db, sql, args)
}

// Query runs sql on one of the pool's connections, outside any transaction.
// The connection is busy until the rows are closed. Rows is never nil; a
// failed query returns Rows reporting the error.
func (d *DB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return queryOn(ctx, d.db, sql, args)
}

// QueryRow runs sql on one of the pool's connections, outside any
// transaction. Scan returns pgx.ErrNoRows when there is no row.
func (d *DB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return queryRowOn(ctx, d.db, sql, args)
}

// SendBatch runs b's statements in order in a transaction of its own, as
// pgx runs a batch sent outside a transaction in one implicit transaction:
// Close commits it when no statement failed and rolls it back otherwise, and
// returns the first error (a statement's, a callback's or the commit's).
func (d *DB) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if err := checkBatch(b); err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	stx, err := d.db.BeginTx(ctx, nil)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	br := newBatchResults(ctx, stx, b)
	br.end = func(failed bool) error {
		if failed {
			return stx.Rollback()
		}
		return stx.Commit()
	}
	return br
}
