// Package idemsql lets idem run on database/sql: it adapts a *sql.DB and a
// *sql.Tx to the pgx interfaces idem's functions take, for any PostgreSQL
// driver registered with database/sql, such as pgx's own stdlib driver
// ("pgx") and lib/pq ("postgres").
//
// Wrap turns a *sql.DB into an idem.TxBeginner and idem.DBTX, so Do, Claim,
// the lease calls, Transition and Purge take it as they take a
// *pgxpool.Pool. WrapTx turns a *sql.Tx the caller began into a pgx.Tx for
// WithIdempotency, ConsumeOnce and InsertOrGetTx; the caller still commits
// it. Inside fn, SQLTx reaches the *sql.Tx again, through the guard idem puts
// around the transaction, so that code written for database/sql runs in the
// same transaction:
//
//	db, _ := sql.Open("postgres", dsn) // or "pgx"
//	res, err := idem.Do(ctx, idemsql.Wrap(db), key,
//		func(ctx context.Context, tx pgx.Tx) (int64, error) {
//			stx, _ := idemsql.SQLTx(tx)
//			var id int64
//			err := stx.QueryRowContext(ctx,
//				`INSERT INTO signups (user_id) VALUES ($1) RETURNING id`, 42).Scan(&id)
//			return id, err
//		})
//
// # How it maps pgx onto database/sql
//
// Begin on a wrapped transaction opens a savepoint, as pgx does: Commit on
// it releases the savepoint, Rollback rolls back to it and releases it.
// Commit and Rollback on the transaction itself end the *sql.Tx. A
// pgx.Batch runs its statements one after the other, in order, calling each
// one's callback with its result; there is no pipelining, so a batch costs a
// round trip per statement. On a wrapped *sql.DB a batch runs in a
// transaction of its own, committed when it is closed without a statement
// error, as pgx runs a batch in one implicit transaction. sql.ErrNoRows
// becomes pgx.ErrNoRows (which matches both), and a []string argument is
// sent as a PostgreSQL array literal, which drivers that cannot bind Go
// slices accept for a text[] parameter.
//
// Errors keep the driver's types. idem recognises SQLSTATEs (40001, 40P01,
// 23505, 55P03) from any error with a SQLState method, which lib/pq's
// *pq.Error and pgx's *pgconn.PgError both have, so IsRetryable and Do's
// retries work with both drivers. A COMMIT that fails with a server error
// did not commit; one that fails with driver.ErrBadConn or a network error
// may have, and Do reports idem.ErrOutcomeUnknown as it does with pgx.
//
// # Limits
//
// A wrapped transaction's Conn returns nil and LargeObjects returns a zero
// value whose methods must not be called; Prepare is not supported; CopyFrom
// inserts row by row. TxOptions.BeginQuery, TxOptions.CommitQuery and
// Batch.BeginTx are not supported. The context passed to Begin bounds the
// whole transaction, as database/sql's BeginTx does: when it ends, the
// driver rolls the transaction back. Commit cannot be cancelled by its
// context, since database/sql's Commit takes none. Arguments must be values
// the driver accepts: lib/pq, unlike pgx, rejects most Go types it does not
// know. Behind PgBouncer in transaction pooling mode, give lib/pq
// binary_parameters=yes: without it, a statement with arguments outside a
// transaction takes two round trips that PgBouncer may send to two servers
// ("unnamed prepared statement does not exist").
package idemsql
