package main

// The mysql-* suites run on MySQL or MariaDB (-mysql-dsn) through
// database/sql and go-sql-driver/mysql, with the same DSN for every
// variant, under the same rounds, reports and delay proxy (-rtt) as the
// PostgreSQL suites. The bench creates a database of its own on that server
// (mysqlDatabase), with idem's tables (idemmysql.Migrate) and the business
// tables, and drops it at the end.
//
// Every statement with arguments, the business INSERT included, is a
// statement prepared once per connection of the pool and reused there (a
// *sql.Stmt of the pool, run through tx.StmtContext), as idemmysql prepares
// its own: each costs one round trip. Run with the DSN's defaults instead,
// go-sql-driver would prepare and close every statement with arguments
// (two round trips), in every variant alike.

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/internal/delayproxy"
)

// mysqlDSN is the server of the mysql-* suites (-mysql-dsn).
var mysqlDSN = cmp.Or(os.Getenv("TEST_MYSQL_DSN"), "root@tcp(127.0.0.1:3306)/test")

// mysqlDatabase is the database the bench creates and drops on that server.
var mysqlDatabase = "idem_bench"

var (
	// mysqlDB is the pool of the mysql-* suites under the current network
	// (through its delay proxy, with -rtt), on mysqlDatabase.
	mysqlDB *sql.DB
	// myStmts are mysqlDB's prepared statements.
	myStmts *mysqlStatements
	// mysqlVersion is the server's VERSION(); mariaDB says whether it is
	// MariaDB, whose claim reads its answer with RETURNING.
	mysqlVersion string
	mariaDB      bool
)

// mysqlConfig is -mysql-dsn's configuration, on addr (its own when "") and
// database db.
func mysqlConfig(addr, db string) (*mysql.Config, error) {
	cfg, err := mysql.ParseDSN(mysqlDSN)
	if err != nil {
		return nil, fmt.Errorf("-mysql-dsn: %w", err)
	}
	if cfg.Net != "tcp" {
		return nil, fmt.Errorf("-mysql-dsn: the mysql suites reach the server over TCP (-rtt puts a proxy in front of it), not %q: give an address such as root@tcp(127.0.0.1:3306)/test", cfg.Net)
	}
	if addr != "" {
		cfg.Addr = addr
	}
	cfg.DBName = db
	return cfg, nil
}

// setupMySQL creates mysqlDatabase with idem's tables and the business
// tables on -mysql-dsn's server. It returns the server's address and
// version, and a function that drops the database.
func setupMySQL(ctx context.Context) (addr, version string, drop func(), err error) {
	cfg, err := mysqlConfig("", "")
	if err != nil {
		return "", "", nil, err
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return "", "", nil, err
	}
	fail := func(err error) (string, string, func(), error) {
		_ = admin.Close()
		return "", "", nil, err
	}
	var flush string
	if err := admin.QueryRowContext(ctx, `SELECT VERSION(), @@innodb_flush_log_at_trx_commit`).Scan(&version, &flush); err != nil {
		return fail(fmt.Errorf("cannot reach MySQL at %s (set -mysql-dsn or TEST_MYSQL_DSN): %w", cfg.Addr, err))
	}
	mariaDB = strings.Contains(strings.ToLower(version), "mariadb")
	if _, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+mysqlDatabase); err != nil {
		return fail(err)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+mysqlDatabase); err != nil {
		return fail(err)
	}
	drop = func() {
		_, _ = admin.ExecContext(context.Background(), "DROP DATABASE IF EXISTS "+mysqlDatabase)
		_ = admin.Close()
	}
	cfg.DBName = mysqlDatabase
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		drop()
		return "", "", nil, err
	}
	defer db.Close()
	if err := idemmysql.Migrate(ctx, db); err != nil {
		drop()
		return "", "", nil, err
	}
	for _, ddl := range []string{
		`CREATE TABLE orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, amount BIGINT NOT NULL,
			created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE = InnoDB`,
		// As the scenario has it: the sign-up is unique per user and activity.
		`CREATE TABLE signups (id BIGINT AUTO_INCREMENT PRIMARY KEY, user_id BIGINT NOT NULL, activity_id BIGINT NOT NULL,
			UNIQUE KEY uk_user_activity (user_id, activity_id)) ENGINE = InnoDB`,
		// A table with a primary key like the record's and one column: the
		// least a row per key in the database can cost.
		`CREATE TABLE keyed (scope VARBINARY(255) NOT NULL, idem_key VARBINARY(255) NOT NULL,
			status VARCHAR(16) NOT NULL, PRIMARY KEY (scope, idem_key)) ENGINE = InnoDB`,
		// The record table without its index on expires_at (mysql-floor).
		"CREATE TABLE record_noidx LIKE `idempotent_record`",
		"ALTER TABLE record_noidx DROP INDEX idempotent_record_expires_at_idx",
	} {
		if _, err := db.ExecContext(ctx, ddl); err != nil {
			drop()
			return "", "", nil, err
		}
	}
	return cfg.Addr, version + " (innodb_flush_log_at_trx_commit=" + flush + ")", drop, nil
}

// openMySQL opens mysqlDB on addr with maxConns connections, all kept idle
// between operations, and prepares myStmts.
func openMySQL(ctx context.Context, addr string, maxConns int) error {
	db, st, err := openMySQLPool(ctx, addr, maxConns)
	if err != nil {
		return err
	}
	mysqlDB, myStmts = db, st
	return nil
}

// openMySQLPool opens a pool on mysqlDatabase at addr and prepares its
// statements.
func openMySQLPool(ctx context.Context, addr string, maxConns int) (*sql.DB, *mysqlStatements, error) {
	cfg, err := mysqlConfig(addr, mysqlDatabase)
	if err != nil {
		return nil, nil, err
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, nil, err
	}
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	st, err := prepareMySQL(ctx, db)
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return db, st, nil
}

// closeMySQL closes mysqlDB.
func closeMySQL() {
	myStmts.close()
	_ = mysqlDB.Close()
	mysqlDB, myStmts = nil, nil
}

// pingMySQL is the median time of 200 SELECT 1 round trips on one
// connection to the server at addr, after a warm-up.
func pingMySQL(ctx context.Context, addr string) (time.Duration, error) {
	cfg, err := mysqlConfig(addr, "")
	if err != nil {
		return 0, err
	}
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return 0, err
	}
	defer db.Close()
	conn, err := db.Conn(ctx)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	ping := func() error {
		var one int
		return conn.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	}
	if _, err := delayproxy.MeasureRTT(20, ping); err != nil {
		return 0, err
	}
	return delayproxy.MeasureRTT(200, ping)
}

// The statements idemmysql.Do runs for a new key with the default table and
// options, written out by hand (TestMySQLModelStatements holds them to the
// dialect's): the claim, an upsert that reads the key's claim token and
// record back with RETURNING on MariaDB, and on MySQL 8 with a SELECT ...
// FOR UPDATE after it; and the completion, whose row count Do checks
// before COMMIT.
const (
	myRecordColumns = "attempt, status, fingerprint, response,\n\texpires_at <= UTC_TIMESTAMP(6),\n\tlocked_until IS NOT NULL,\n\tCOALESCE(locked_until > UTC_TIMESTAMP(6), FALSE)"
	myClaim         = "INSERT INTO `idempotent_record` (scope, idem_key, fingerprint, status, attempt, claim_token, created_at, updated_at, expires_at)\n" +
		"\tVALUES (?, ?, ?, 'processing', 1, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)\n" +
		"\tON DUPLICATE KEY UPDATE attempt = attempt"
	myClaimReturning = myClaim + "\n\tRETURNING claim_token, " + myRecordColumns
	myClaimRead      = "SELECT claim_token, " + myRecordColumns + " FROM `idempotent_record` WHERE scope = ? AND idem_key = ? FOR UPDATE"
	myComplete       = "UPDATE `idempotent_record` SET status = ?, response = ?, updated_at = UTC_TIMESTAMP(6)\n" +
		"\tWHERE scope = ? AND idem_key = ? AND status = 'processing' AND attempt = ?"
)

// mysqlStatements are the prepared statements of one pool.
type mysqlStatements struct {
	claim, claimRead, complete *sql.Stmt
	insertOrder, insertSignup  *sql.Stmt
	keyedInsert, keyedUpdate   *sql.Stmt
	// recordRow holds, by table, the plain INSERT and UPDATE of the
	// mysql-floor suite's record rows.
	recordRow map[string][2]*sql.Stmt
	all       []*sql.Stmt
}

func prepareMySQL(ctx context.Context, db *sql.DB) (*mysqlStatements, error) {
	st := &mysqlStatements{recordRow: map[string][2]*sql.Stmt{}}
	claim := myClaim
	if mariaDB {
		claim = myClaimReturning
	}
	var noIdx, idx [2]*sql.Stmt
	for _, p := range []struct {
		dst   **sql.Stmt
		query string
	}{
		{&noIdx[0], fmt.Sprintf(myRecordRowInsert, "record_noidx")},
		{&noIdx[1], fmt.Sprintf(myRecordRowComplete, "record_noidx")},
		{&idx[0], fmt.Sprintf(myRecordRowInsert, "idempotent_record")},
		{&idx[1], fmt.Sprintf(myRecordRowComplete, "idempotent_record")},
		{&st.claim, claim},
		{&st.claimRead, myClaimRead},
		{&st.complete, myComplete},
		{&st.insertOrder, `INSERT INTO orders (user_id, amount) VALUES (?, ?)`},
		{&st.insertSignup, `INSERT INTO signups (user_id, activity_id) VALUES (?, 1)`},
		{&st.keyedInsert, `INSERT INTO keyed (scope, idem_key, status) VALUES (?, ?, 'processing')`},
		{&st.keyedUpdate, `UPDATE keyed SET status = 'succeeded' WHERE scope = ? AND idem_key = ?`},
	} {
		s, err := db.PrepareContext(ctx, p.query)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("preparing %q: %w", p.query, err)
		}
		*p.dst = s
		st.all = append(st.all, s)
	}
	st.recordRow["record_noidx"], st.recordRow["idempotent_record"] = noIdx, idx
	return st, nil
}

func (st *mysqlStatements) close() {
	if st == nil {
		return
	}
	for _, s := range st.all {
		_ = s.Close()
	}
}

// insertOrderMySQL is fn of the mysql-model suite: one INSERT.
func insertOrderMySQL(ctx context.Context, tx *sql.Tx) (int64, error) {
	r, err := tx.StmtContext(ctx, myStmts.insertOrder).ExecContext(ctx, 42, 999)
	if err != nil {
		return 0, err
	}
	return r.LastInsertId()
}

// insertSignupMySQL inserts user's sign-up with st.
func insertSignupMySQL(ctx context.Context, tx *sql.Tx, st *mysqlStatements, user int64) (int64, error) {
	r, err := tx.StmtContext(ctx, st.insertSignup).ExecContext(ctx, user)
	if err != nil {
		return 0, err
	}
	return r.LastInsertId()
}

// mysqlTx runs body in a transaction of mysqlDB's, and commits it.
func mysqlTx(ctx context.Context, db *sql.DB, body func(tx *sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := body(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// bareMySQL is a bare transaction: BEGIN, the INSERT, COMMIT.
func bareMySQL(ctx context.Context, _ *pgxpool.Pool, _ idem.Key) error {
	return mysqlTx(ctx, mysqlDB, func(tx *sql.Tx) error {
		_, err := insertOrderMySQL(ctx, tx)
		return err
	})
}

// sqlModelMySQL runs Do's statements for a new key, one after the other as
// Do runs them, with no library logic, around the INSERT into orders.
func sqlModelMySQL(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
	return recordModelMySQL(ctx, key, insertOrderMySQL)
}

// recordModelMySQL runs Do's statements for a new key around fn by hand:
// BEGIN, the claim (and on MySQL 8 its read), a check that the claim token
// read back is the one sent, fn, the completion with a check that it
// changed one row, COMMIT.
func recordModelMySQL(ctx context.Context, key idem.Key, fn func(context.Context, *sql.Tx) (int64, error)) error {
	token := make([]byte, 16)
	_, _ = rand.Read(token)
	return mysqlTx(ctx, mysqlDB, func(tx *sql.Tx) error {
		var (
			got, fingerprint, response []byte
			attempt                    int64
			status                     string
			expired, leased, leaseLive bool
		)
		args := []any{key.Scope, key.ID, []byte{}, token, idem.DefaultTTL.Microseconds()}
		var row *sql.Row
		if mariaDB {
			row = tx.StmtContext(ctx, myStmts.claim).QueryRowContext(ctx, args...)
		} else {
			if _, err := tx.StmtContext(ctx, myStmts.claim).ExecContext(ctx, args...); err != nil {
				return err
			}
			row = tx.StmtContext(ctx, myStmts.claimRead).QueryRowContext(ctx, key.Scope, key.ID)
		}
		if err := row.Scan(&got, &attempt, &status, &fingerprint, &response, &expired, &leased, &leaseLive); err != nil {
			return err
		}
		if !bytes.Equal(got, token) {
			return errors.New("sql-model: a new key was not claimed")
		}
		id, err := fn(ctx, tx)
		if err != nil {
			return err
		}
		r, err := tx.StmtContext(ctx, myStmts.complete).ExecContext(ctx, "succeeded", strconv.AppendInt(nil, id, 10), key.Scope, key.ID, attempt)
		if err != nil {
			return err
		}
		if n, err := r.RowsAffected(); err != nil || n != 1 {
			return cmp.Or(err, fmt.Errorf("sql-model: the completion changed %d rows", n))
		}
		return nil
	})
}

// mysqlModelVariants put idemmysql.Do beside its own statements by hand
// (the baseline) and a bare transaction, alone, so that every round
// measures the two seconds apart.
var mysqlModelVariants = []variant{
	{"sql-model", sqlModelMySQL},
	{"Do", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		_, err := idemmysql.Do(ctx, mysqlDB, key, insertOrderMySQL)
		return err
	}},
	{"bare", bareMySQL},
}

func setupMySQLRecipe(ctx context.Context, _ *pgxpool.Pool) error {
	return openRedis(ctx, "mysql-recipe")
}

// signupMySQL is the recipe's database transaction on db: BEGIN, the
// sign-up's INSERT, COMMIT.
func signupMySQL(db *sql.DB, st *mysqlStatements, user int64) func(ctx context.Context) (int64, error) {
	return func(ctx context.Context) (int64, error) {
		var id int64
		err := mysqlTx(ctx, db, func(tx *sql.Tx) error {
			var err error
			id, err = insertSignupMySQL(ctx, tx, st, user)
			return err
		})
		return id, err
	}
}

// mysqlRecipeAsWritten is a sign-up through the recipe as the scenario
// writes it, with its database transaction on MySQL: SET NX, EXISTS, the
// transaction, then the three SETs one by one.
func mysqlRecipeAsWritten(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
	user := signupUser.Add(1)
	return runRecipe(ctx, signupMySQL(mysqlDB, myStmts, user), user, key.ID, true, nil)
}

// keyedMySQL is a bare sign-up with a plain row of the key's written in the
// same transaction before it (INSERT into keyed) and, with update, changed
// after it: one or two primary-key writes, the least that any record of a
// key kept in the database adds.
func keyedMySQL(update bool) func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
	return func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		user := signupUser.Add(1)
		return mysqlTx(ctx, mysqlDB, func(tx *sql.Tx) error {
			if _, err := tx.StmtContext(ctx, myStmts.keyedInsert).ExecContext(ctx, key.Scope, key.ID); err != nil {
				return err
			}
			if _, err := insertSignupMySQL(ctx, tx, myStmts, user); err != nil {
				return err
			}
			if update {
				_, err := tx.StmtContext(ctx, myStmts.keyedUpdate).ExecContext(ctx, key.Scope, key.ID)
				return err
			}
			return nil
		})
	}
}

// doSignupMySQL is a sign-up through idemmysql.Do.
func doSignupMySQL(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
	user := signupUser.Add(1)
	_, err := idemmysql.Do(ctx, mysqlDB, key, func(ctx context.Context, tx *sql.Tx) (map[string]any, error) {
		id, err := insertSignupMySQL(ctx, tx, myStmts, user)
		return map[string]any{"ok": true, "orderId": id}, err
	})
	return err
}

// mysqlRecipeVariants: the recipe as written first (the baseline), the
// same with its three SETs pipelined, the sign-up through idemmysql.Do, a
// bare transaction, and the bare transaction with one and two plain
// primary-key writes of the key's: the floor under any record in the
// database.
var mysqlRecipeVariants = []variant{
	{"redis recipe", mysqlRecipeAsWritten},
	{"redis recipe, pipelined", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		user := signupUser.Add(1)
		return runRecipe(ctx, signupMySQL(mysqlDB, myStmts, user), user, key.ID, false, nil)
	}},
	{"Do", doSignupMySQL},
	{"bare transaction", func(ctx context.Context, _ *pgxpool.Pool, _ idem.Key) error {
		_, err := signupMySQL(mysqlDB, myStmts, signupUser.Add(1))(ctx)
		return err
	}},
	{"bare +keyed insert", keyedMySQL(false)},
	{"bare +keyed insert, update", keyedMySQL(true)},
}
