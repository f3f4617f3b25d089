package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
)

// The mysql-floor suite climbs from the least a row of the key's adds to a
// bare sign-up up to idemmysql.Do, one piece of the record at a time,
// hand-written on database/sql with no library logic, so that a run shows
// which piece costs what on the machine at hand. Every variant is a
// sign-up into signups with a new key, in Do's round trips (BEGIN, a write
// of the key's, the sign-up's INSERT, a second write of the key's, COMMIT):
//
//	keyed insert, update    an INSERT into keyed (a primary key like the
//	                        record's and one column), the sign-up, an UPDATE
//	                        of that row: the baseline
//	record row, no index    a plain INSERT of the record's columns, as the
//	                        claim writes them, into a copy of the record
//	                        table without its index on expires_at; the
//	                        sign-up; the completion's UPDATE (status,
//	                        response, updated_at) of that row
//	record row              the same into the record table itself, with
//	                        its index on expires_at
//	record SQL              Do's own claim (INSERT ... ON DUPLICATE KEY
//	                        UPDATE ... RETURNING on MariaDB) and completion,
//	                        with its checks of the token read back and the
//	                        row count: what Do costs the database
//	Do                      idemmysql.Do
//	redis recipe            the recipe as the scenario writes it, for scale
var mysqlFloorVariants = []variant{
	{"keyed insert, update", keyedMySQL(true)},
	{"record row, no index", recordRowMySQL("record_noidx")},
	{"record row", recordRowMySQL("idempotent_record")},
	{"record SQL", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		user := signupUser.Add(1)
		return recordModelMySQL(ctx, key, func(ctx context.Context, tx *sql.Tx) (int64, error) {
			return insertSignupMySQL(ctx, tx, myStmts, user)
		})
	}},
	{"Do", doSignupMySQL},
	{"redis recipe", mysqlRecipeAsWritten},
}

func setupMySQLFloor(ctx context.Context, _ *pgxpool.Pool) error {
	return openRedis(ctx, "mysql-floor")
}

// myRecordRowInsert and myRecordRowComplete are a plain INSERT of the
// claim's columns and the completion's UPDATE of them, into the table
// named where %s is: the record's row without the claim's upsert, its
// RETURNING or the completion's guards.
const (
	myRecordRowInsert = "INSERT INTO `%s` (scope, idem_key, fingerprint, status, attempt, claim_token, created_at, updated_at, expires_at)\n" +
		"\tVALUES (?, ?, '', 'processing', 1, ?, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 DAY)"
	myRecordRowComplete = "UPDATE `%s` SET status = 'succeeded', response = ?, updated_at = UTC_TIMESTAMP(6)\n" +
		"\tWHERE scope = ? AND idem_key = ?"
)

// recordRowMySQL is a sign-up between a plain INSERT of the record's
// columns into table and the completion's UPDATE of that row.
func recordRowMySQL(table string) func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
	return func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		insert, complete := myStmts.recordRow[table][0], myStmts.recordRow[table][1]
		user := signupUser.Add(1)
		token := make([]byte, 16)
		_, _ = rand.Read(token)
		return mysqlTx(ctx, mysqlDB, func(tx *sql.Tx) error {
			if _, err := tx.StmtContext(ctx, insert).ExecContext(ctx, key.Scope, key.ID, token); err != nil {
				return err
			}
			id, err := insertSignupMySQL(ctx, tx, myStmts, user)
			if err != nil {
				return err
			}
			_, err = tx.StmtContext(ctx, complete).ExecContext(ctx, strconv.AppendInt(nil, id, 10), key.Scope, key.ID)
			return err
		})
	}
}
