// Package idemsql is idem on database/sql, for any PostgreSQL driver
// registered with it, such as pgx's own stdlib driver ("pgx") and lib/pq
// ("postgres"). It runs the claim protocol of the root package, with the
// same guarantees, keys, options, results and errors; fn receives the
// *sql.Tx itself:
//
//	db, _ := sql.Open("postgres", dsn) // or "pgx"
//	res, err := idemsql.Do(ctx, db, key,
//		func(ctx context.Context, tx *sql.Tx) (int64, error) {
//			var id int64
//			err := tx.QueryRowContext(ctx,
//				`INSERT INTO signups (user_id) VALUES ($1) RETURNING id`, 42).Scan(&id)
//			return id, err
//		})
//
// Do begins a transaction of its own on a *sql.DB; WithIdempotency works
// inside the caller's *sql.Tx, which the caller still commits. Every other
// call of the root package has its form here: Claim and Lease (lease mode,
// Complete in the business *sql.Tx), IssueToken, ConsumeOnce, InsertOrGet
// and InsertOrGetTx, NewStateMachine and Transition, Purge and Purger, and
// Lookup, Stuck, CountExpired and TableStats. The calls that take a DBTX
// accept a *sql.DB, a *sql.Conn or a *sql.Tx, and on a *sql.Tx run in the
// caller's transaction. The HTTP middleware serves a database/sql
// application through idemhttp.New(idemhttp.SQL(db), cfg).
//
// # What differs from pgx
//
// Statements run one after the other: there is no pipelining, so Do costs a
// round trip per statement (BEGIN, the claim, fn's statements, the
// completion, COMMIT) where the pgx API sends BEGIN with the claim and the
// completion with COMMIT.
//
// fn must not commit or roll back its *sql.Tx: database/sql gives idem no
// way to refuse it, as the pgx API does. A call whose fn did fails, and what
// fn committed then has no record of its key.
//
// Errors keep the driver's types. idem recognises SQLSTATEs (40001, 40P01,
// 23505, 55P03) from any error with a SQLState method, which lib/pq's
// *pq.Error and pgx's *pgconn.PgError both have, so IsRetryable and Do's
// retries work with both drivers. A COMMIT that fails with a server error
// did not commit; one that fails with driver.ErrBadConn or a network error
// may have, and Do reports idem.ErrOutcomeUnknown as it does with pgx; one
// never sent, because its context had ended, did not commit.
//
// idem.WithTxOptions sets the isolation level and the access mode of Do's
// transactions; its deferrable mode becomes a SET TRANSACTION statement,
// and BeginQuery and CommitQuery are refused. The context of a call bounds
// its whole transaction, as database/sql's BeginTx does: when it ends, the
// driver rolls the transaction back. Arguments must be values the driver
// accepts: lib/pq, unlike pgx, rejects most Go types it does not know.
// Behind PgBouncer in transaction pooling mode, give lib/pq
// binary_parameters=yes: without it, a statement with arguments outside a
// transaction takes two round trips that PgBouncer may send to two servers
// ("unnamed prepared statement does not exist").
package idemsql
