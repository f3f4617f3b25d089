// Package idemmysql is idem on MySQL 8 and MariaDB, through database/sql
// and github.com/go-sql-driver/mysql. It runs the claim protocol of the
// root package, with its keys, options, results and errors; fn receives the
// *sql.Tx itself:
//
//	db, _ := sql.Open("mysql", "app:secret@tcp(127.0.0.1:3306)/shop")
//	if err := idemmysql.Migrate(ctx, db); err != nil { ... }
//	res, err := idemmysql.Do(ctx, db, key,
//		func(ctx context.Context, tx *sql.Tx) (int64, error) {
//			r, err := tx.ExecContext(ctx, `INSERT INTO signup_record (user_id, activity_id) VALUES (?, ?)`, 42, 7)
//			if err != nil {
//				return 0, err
//			}
//			return r.LastInsertId()
//		})
//
// Do begins a transaction of its own on a *sql.DB; WithIdempotency works
// inside the caller's *sql.Tx, which the caller still commits; ConsumeOnce
// processes a queue message once per consumer inside the caller's *sql.Tx;
// InsertOrGet creates a row once per business key (the existing row for a
// duplicate sign-up). Claim and Lease are lease mode, for calls to the outside world;
// IssueToken hands out server-issued keys; NewStateMachine runs guarded
// transitions of business rows; Purge, Purger, CountExpired, Lookup, Stuck
// and TableStats are for operators; idemhttp.MySQL serves the HTTP
// middleware. Migrate creates the tables (migrations/mysql holds the raw
// SQL for other migration tools).
//
// # What MySQL changes
//
// The record table keys on (scope, key) as VARBINARY, the clustered primary
// key with no other unique index: keys are byte-exact ("Abc", "abc" and
// "abc " are three keys), and a burst on one key takes record locks only.
// Keys longer than 255 bytes are refused before any SQL, never cut to fit.
// Times are DATETIME(6) in UTC, compared with UTC_TIMESTAMP(6): the
// session's time_zone cannot move an expiry.
//
// A claim is an INSERT ... ON DUPLICATE KEY UPDATE that takes the key's row
// lock, and its answer is read under that lock: by RETURNING on MariaDB, by
// SELECT ... FOR UPDATE on MySQL. Ownership is a random claim token
// returned by that read, never the rows affected, which a DSN with
// clientFoundRows=true reports as 1 for a duplicate. So the protocol needs
// no particular isolation level: under REPEATABLE READ, a key another
// transaction committed after the caller's snapshot is replayed, not run
// again. The row stays locked until the claiming transaction ends, so
// duplicates of a key in flight queue behind it.
//
// InnoDB ends a transaction with a deadlock where PostgreSQL would not:
// when the first execution of a key rolls back while several duplicates
// wait for it, all but one of them get error 1213, and the server has then
// rolled their whole transactions back. Do retries those attempts (into a
// replay, or a single run). WithIdempotency and ConsumeOnce return a
// *TxAbortedError, which idem.IsRetryable reports, and run no other
// statement on the *sql.Tx: database/sql does not know it is gone, and
// would run further statements outside any transaction.
//
// Which server a process talks to is asked once, of the first handle a call
// is given (SELECT VERSION()): idemmysql assumes that one process talks to
// one kind of server. On MariaDB, idem.NoWait bounds the claim's wait on
// the server (SET STATEMENT innodb_lock_wait_timeout=0 FOR ..., which
// changes no setting of the session or the transaction), and a ctx deadline
// bounds it too (max_statement_time), where the client alone would give up
// and leave the statement waiting on the server. On MySQL 8 idem.NoWait is
// refused.
//
// idem.WithHoldTimeout bounds Do on MariaDB: once the key is claimed, the
// session's idle_transaction_timeout (whole seconds, rounded up) and
// max_statement_time are lowered to the bound (a lower value is kept), so
// that the server ends a holder that hangs idle in its transaction, and
// interrupts a statement of fn's that runs past it (error 1969). They are
// settings of the session, which outlive COMMIT: the transaction runs on a
// connection of its own, which gets its settings back once the
// transaction ends, however it ended, or is discarded rather than returned
// to the pool. For the same reason WithIdempotency refuses the bound (the
// settings would outlive its savepoints, on the caller's connection), and
// MySQL 8, which has no idle-transaction bound, refuses it too.
//
// Statements run one after the other. Do keeps its own statements prepared
// on each connection of the pool, so that each costs one round trip after a
// connection's first use: a bare transaction's round trips plus two on
// MariaDB (the claim, the completion) and three on MySQL (the claim's
// read). In the caller's transaction idem cannot reach the pool to keep
// them prepared, and go-sql-driver prepares and closes each statement with
// arguments (two round trips) unless the DSN has interpolateParams=true.
// Give the pool a MaxOpenConns below the server's max_connections (151 by
// default). docs/mysql.md has the rules, the counts and what was run on
// which server.
package idemmysql
