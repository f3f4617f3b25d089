package main

import (
	"context"
	"database/sql"
	"errors"
	"net/http"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemmysql"
)

// mysqlStore is the sign-up on MySQL or MariaDB, through database/sql:
// db's connections use the example's database (with parseTime), and the
// handlers' transaction is idemhttp.SQLTx.
type mysqlStore struct{ db *sql.DB }

// mysqlTables are the sign-up's tables, one statement each (the driver
// runs one statement per call unless the DSN sets multiStatements).
var mysqlTables = []string{
	`CREATE TABLE IF NOT EXISTS activities (
		id BIGINT AUTO_INCREMENT PRIMARY KEY,
		title VARCHAR(200) NOT NULL,
		place VARCHAR(200) NOT NULL DEFAULT '',
		starts_at DATETIME NOT NULL,
		seats INT NOT NULL DEFAULT 12,
		taken INT NOT NULL DEFAULT 0)`,
	`CREATE TABLE IF NOT EXISTS users (id BIGINT PRIMARY KEY, name VARCHAR(100) NOT NULL)`,
	`INSERT INTO users (id, name) VALUES
		(1, 'Ada Lovelace'), (2, 'Grace Hopper'), (3, 'Alan Turing'),
		(4, 'Katherine Johnson'), (5, 'Edsger Dijkstra')
	ON DUPLICATE KEY UPDATE name = VALUES(name)`,
	// The unique business key is the last gate: one sign-up per user and
	// activity, whatever the tokens say.
	`CREATE TABLE IF NOT EXISTS signups (
		id BIGINT AUTO_INCREMENT PRIMARY KEY,
		user_id BIGINT NOT NULL,
		activity_id BIGINT NOT NULL,
		created_at DATETIME(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),
		UNIQUE KEY uk_user_activity (user_id, activity_id),
		FOREIGN KEY (user_id) REFERENCES users (id),
		FOREIGN KEY (activity_id) REFERENCES activities (id))`,
}

func (s mysqlStore) setUp(ctx context.Context) error {
	if err := idemmysql.Migrate(ctx, s.db); err != nil {
		return err
	}
	for _, stmt := range mysqlTables {
		if _, err := s.db.ExecContext(ctx, stmt); err != nil {
			return err
		}
	}
	return nil
}

func (s mysqlStore) addActivity(ctx context.Context, title, place string, seats int) (int64, error) {
	// starts_at is in UTC, as parseTime reads it back.
	r, err := s.db.ExecContext(ctx, `
		INSERT INTO activities (title, place, starts_at, seats)
		VALUES (?, ?, TIMESTAMP(UTC_DATE() + INTERVAL 3 DAY, '07:00:00'), ?)`, title, place, seats)
	if err != nil {
		return 0, err
	}
	return r.LastInsertId()
}

func (s mysqlStore) activity(ctx context.Context, activityID, user int64) (activityView, error) {
	var a activityView
	err := s.db.QueryRowContext(ctx, `
		SELECT a.id, a.title, a.place, a.starts_at, a.seats, a.seats - a.taken,
		       u.id, u.name,
		       (SELECT MIN(s.id) FROM signups s WHERE s.activity_id = a.id AND s.user_id = u.id),
		       (SELECT COUNT(*) FROM signups s WHERE s.activity_id = a.id AND s.user_id = u.id)
		FROM activities a LEFT JOIN users u ON u.id = ?
		WHERE a.id = ?`, user, activityID).Scan(
		&a.ID, &a.Title, &a.Place, &a.StartsAt, &a.Seats, &a.SeatsLeft,
		&a.UserID, &a.UserName, &a.SignupID, &a.Rows)
	return a, err
}

func (s mysqlStore) issueToken(ctx context.Context, scope string, ttl time.Duration) (string, error) {
	return idemmysql.IssueToken(ctx, s.db, scope, ttl)
}

// middleware answers a duplicate in flight 409 at once on MariaDB; on
// MySQL 8 it would need Config.Wait (idemhttp.MySQL).
func (s mysqlStore) middleware(cfg idemhttp.Config) (func(http.Handler) http.Handler, error) {
	return idemhttp.New(idemhttp.MySQL(s.db), cfg)
}

func (mysqlStore) lockActivity(ctx context.Context, activityID int64) (int, bool, error) {
	var seatsLeft int
	err := idemhttp.SQLTx(ctx).QueryRowContext(ctx, `SELECT seats - taken FROM activities WHERE id = ? FOR UPDATE`, activityID).Scan(&seatsLeft)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return seatsLeft, err == nil, err
}

// mysqlFindSignup is a locking read: under REPEATABLE READ, MySQL's
// default, a plain SELECT reads the transaction's snapshot, which can miss
// a sign-up committed after it was taken (the very row a duplicate key
// error just met); LOCK IN SHARE MODE reads the latest committed row, and
// goes with the shared lock the duplicate key error left (FOR UPDATE would
// upgrade it, and deadlock against a concurrent duplicate).
const mysqlFindSignup = `SELECT id FROM signups WHERE user_id = ? AND activity_id = ? LOCK IN SHARE MODE`

func (mysqlStore) insertOrGet(ctx context.Context, user, activityID int64) (int64, bool, error) {
	var id int64
	// A plain INSERT: on MySQL its duplicate key error (1062) rolls back
	// the statement alone, and InsertOrGet reads the existing sign-up.
	created, err := idemmysql.InsertOrGet(ctx, idemhttp.SQLTx(ctx),
		idem.Query{SQL: `INSERT INTO signups (user_id, activity_id) VALUES (?, ?)`, Args: []any{user, activityID}},
		idem.Query{SQL: mysqlFindSignup, Args: []any{user, activityID}}, &id)
	return id, created, err
}

func (mysqlStore) findSignup(ctx context.Context, user, activityID int64) (int64, bool, error) {
	var id int64
	err := idemhttp.SQLTx(ctx).QueryRowContext(ctx, mysqlFindSignup, user, activityID).Scan(&id)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return id, err == nil, err
}

func (mysqlStore) takeSeat(ctx context.Context, activityID int64) error {
	_, err := idemhttp.SQLTx(ctx).ExecContext(ctx, `UPDATE activities SET taken = taken + 1 WHERE id = ?`, activityID)
	return err
}
