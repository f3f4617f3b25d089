package main

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/migrations"
)

// pgStore is the sign-up on PostgreSQL, through pgx: the pool's
// search_path is schema, and the handlers' transaction is idemhttp.Tx.
type pgStore struct {
	pool   *pgxpool.Pool
	schema string
}

func (s pgStore) setUp(ctx context.Context) error {
	if err := migrations.Up(ctx, s.pool, migrations.WithTable(s.schema, idem.DefaultTable)); err != nil {
		return err
	}
	// The unique business key is the last gate: one sign-up per user and
	// activity, whatever the tokens say.
	_, err := s.pool.Exec(ctx, `
		CREATE TABLE IF NOT EXISTS activities (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			title text NOT NULL,
			place text NOT NULL DEFAULT '',
			starts_at timestamptz NOT NULL DEFAULT now(),
			seats int NOT NULL DEFAULT 12,
			taken int NOT NULL DEFAULT 0);
		-- An earlier version of this example made activities without these.
		ALTER TABLE activities
			ADD COLUMN IF NOT EXISTS place text NOT NULL DEFAULT '',
			ADD COLUMN IF NOT EXISTS starts_at timestamptz NOT NULL DEFAULT now(),
			ADD COLUMN IF NOT EXISTS seats int NOT NULL DEFAULT 12,
			ADD COLUMN IF NOT EXISTS taken int NOT NULL DEFAULT 0;
		CREATE TABLE IF NOT EXISTS users (id bigint PRIMARY KEY, name text NOT NULL);
		INSERT INTO users (id, name) VALUES
			(1, 'Ada Lovelace'), (2, 'Grace Hopper'), (3, 'Alan Turing'),
			(4, 'Katherine Johnson'), (5, 'Edsger Dijkstra')
		ON CONFLICT (id) DO UPDATE SET name = excluded.name;
		CREATE TABLE IF NOT EXISTS signups (
			id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
			user_id bigint NOT NULL REFERENCES users,
			activity_id bigint NOT NULL REFERENCES activities,
			created_at timestamptz NOT NULL DEFAULT now(),
			UNIQUE (user_id, activity_id))`)
	return err
}

func (s pgStore) addActivity(ctx context.Context, title, place string, seats int) (int64, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `
		INSERT INTO activities (title, place, starts_at, seats)
		VALUES ($1, $2, date_trunc('day', now()) + interval '3 days 7 hours', $3)
		RETURNING id`, title, place, seats).Scan(&id)
	return id, err
}

func (s pgStore) activity(ctx context.Context, activityID, user int64) (activityView, error) {
	var a activityView
	err := s.pool.QueryRow(ctx, `
		SELECT a.id, a.title, a.place, a.starts_at, a.seats, a.seats - a.taken,
		       u.id, u.name,
		       (SELECT min(s.id) FROM signups s WHERE s.activity_id = a.id AND s.user_id = u.id),
		       (SELECT count(*) FROM signups s WHERE s.activity_id = a.id AND s.user_id = u.id)
		FROM activities a LEFT JOIN users u ON u.id = $2
		WHERE a.id = $1`, activityID, user).Scan(
		&a.ID, &a.Title, &a.Place, &a.StartsAt, &a.Seats, &a.SeatsLeft,
		&a.UserID, &a.UserName, &a.SignupID, &a.Rows)
	return a, err
}

func (s pgStore) issueToken(ctx context.Context, scope string, ttl time.Duration) (string, error) {
	return idem.IssueToken(ctx, s.pool, scope, ttl)
}

func (s pgStore) middleware(cfg idemhttp.Config) (func(http.Handler) http.Handler, error) {
	return idemhttp.Middleware(s.pool, cfg)
}

func (pgStore) lockActivity(ctx context.Context, activityID int64) (int, bool, error) {
	var seatsLeft int
	err := idemhttp.Tx(ctx).QueryRow(ctx, `SELECT seats - taken FROM activities WHERE id = $1 FOR UPDATE`, activityID).Scan(&seatsLeft)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return seatsLeft, err == nil, err
}

const pgFindSignup = `SELECT id FROM signups WHERE user_id = $1 AND activity_id = $2`

func (pgStore) insertOrGet(ctx context.Context, user, activityID int64) (int64, bool, error) {
	var id int64
	created, err := idem.InsertOrGet(ctx, idemhttp.Tx(ctx),
		idem.Query{SQL: `INSERT INTO signups (user_id, activity_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING id`, Args: []any{user, activityID}},
		idem.Query{SQL: pgFindSignup, Args: []any{user, activityID}}, &id)
	return id, created, err
}

func (pgStore) findSignup(ctx context.Context, user, activityID int64) (int64, bool, error) {
	var id int64
	err := idemhttp.Tx(ctx).QueryRow(ctx, pgFindSignup, user, activityID).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	return id, err == nil, err
}

func (pgStore) takeSeat(ctx context.Context, activityID int64) error {
	_, err := idemhttp.Tx(ctx).Exec(ctx, `UPDATE activities SET taken = taken + 1 WHERE id = $1`, activityID)
	return err
}
