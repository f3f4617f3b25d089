package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemkit/idem"
)

// The usual Redis recipe for a sign-up form, as a Go service would write
// it, is the baseline that idem replaces:
//
//	SET idem:signup:{token} PROCESSING NX EX 300   claim the submission token
//	  taken: GET it; PROCESSING -> "in progress", else GET {token}:resp and replay
//	EXISTS biz:signup:{user}:{activity}             the business key
//	  exists: SET {token} DUP EX 300, answer "already signed up"
//	BEGIN; INSERT INTO signups ...; COMMIT          the row, under a unique index
//	SET biz key NX EX 86400; SET {token}:resp EX 86400; SET {token} DONE EX 86400
//	on failure: DEL {token}                         release the claim
//
// The redis suite sends the three SETs after the commit in one pipeline (the
// recipe as usually written sends them one by one), which favours the
// baseline; the mysql-recipe suite measures both forms.

var (
	redisClient *redis.Client
	signupUser  atomic.Int64
	redisRun    string // a prefix per run: Redis keeps the keys of earlier runs for a day
)

func setupRedis(ctx context.Context, pool *pgxpool.Pool) error {
	if err := openRedis(ctx, "redis"); err != nil {
		return err
	}
	_, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS idem_bench.signups (
		id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
		user_id bigint NOT NULL, activity_id bigint NOT NULL,
		UNIQUE (user_id, activity_id))`)
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, `TRUNCATE idem_bench.signups`) // user ids restart with the process
	return err
}

// openRedis connects the recipe's client to Redis, through the delay proxy
// under -rtt, for the suite named.
func openRedis(ctx context.Context, suite string) error {
	if redisClient != nil {
		_ = redisClient.Close()
	}
	redisClient = redis.NewClient(&redis.Options{Addr: current.redisAddr, PoolSize: 64})
	redisRun = strconv.FormatInt(time.Now().UnixNano(), 36)
	if err := redisClient.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("the %s suite needs Redis at 127.0.0.1:6379: %w", suite, err)
	}
	return nil
}

func insertSignup(ctx context.Context, tx pgx.Tx, user int64) (int64, error) {
	var id int64
	err := tx.QueryRow(ctx, `INSERT INTO idem_bench.signups (user_id, activity_id) VALUES ($1, 1) RETURNING id`, user).Scan(&id)
	return id, err
}

var errRecipeInProgress = errors.New("in progress")

// redisRecipe is one submission through the recipe, with a new token.
func redisRecipe(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
	return recipe(ctx, pool, signupUser.Add(1), key.ID, nil)
}

// recipe runs the recipe for user with token key on PostgreSQL, its three
// SETs after the commit pipelined. lostRedis, when set, is asked after the
// commit whether the connection to Redis is lost (the fault suite's
// injection): the response writes are then never made.
func recipe(ctx context.Context, pool *pgxpool.Pool, user int64, key string, lostRedis func() bool) error {
	return runRecipe(ctx, func(ctx context.Context) (int64, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return 0, err
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		id, err := insertSignup(ctx, tx, user)
		if err != nil {
			return 0, err
		}
		return id, tx.Commit(ctx)
	}, user, key, false, lostRedis)
}

// runRecipe runs the recipe for user with token key, with signup as its
// database transaction (it commits the row and returns its id), and the
// three SETs after the commit sent one by one (oneByOne, as the scenario
// writes them) or in one pipeline. lostRedis is as for recipe.
func runRecipe(ctx context.Context, signup func(ctx context.Context) (int64, error), user int64, key string, oneByOne bool, lostRedis func() bool) error {
	tokenKey := "idem:signup:" + redisRun + ":" + key
	bizKey := "biz:signup:" + redisRun + ":" + strconv.FormatInt(user, 10) + ":1"
	got, err := redisClient.SetNX(ctx, tokenKey, "PROCESSING", 300*time.Second).Result()
	if err != nil {
		return err
	}
	if !got {
		state, err := redisClient.Get(ctx, tokenKey).Result()
		if err != nil {
			return err
		}
		if state == "PROCESSING" {
			return errRecipeInProgress
		}
		// The first answer, or {} when there is none (DUP), as the scenario does.
		if err := redisClient.Get(ctx, tokenKey+":resp").Err(); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		return nil
	}
	if n, err := redisClient.Exists(ctx, bizKey).Result(); err != nil || n > 0 {
		if err == nil {
			err = redisClient.Set(ctx, tokenKey, "DUP", 300*time.Second).Err()
		}
		return err
	}
	id, err := signup(ctx)
	if err != nil {
		redisClient.Del(context.WithoutCancel(ctx), tokenKey) // release, so the user may retry
		return err
	}
	if lostRedis != nil && lostRedis() {
		return errors.New("redis: connection lost") // the token stays PROCESSING until its TTL
	}
	resp, _ := json.Marshal(map[string]any{"ok": true, "orderId": id})
	if oneByOne {
		if err := redisClient.SetNX(ctx, bizKey, id, 24*time.Hour).Err(); err != nil {
			return err
		}
		if err := redisClient.Set(ctx, tokenKey+":resp", resp, 24*time.Hour).Err(); err != nil {
			return err
		}
		return redisClient.Set(ctx, tokenKey, "DONE", 24*time.Hour).Err()
	}
	_, err = redisClient.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.SetNX(ctx, bizKey, id, 24*time.Hour)
		p.Set(ctx, tokenKey+":resp", resp, 24*time.Hour)
		p.Set(ctx, tokenKey, "DONE", 24*time.Hour)
		return nil
	})
	return err
}

// redisVariants: the recipe first (the baseline), then the same submission
// through idem.Do, and a bare transaction for reference.
var redisVariants = []variant{
	{"redis recipe", redisRecipe},
	{"Do", signupDo},
	{"bare transaction", func(ctx context.Context, pool *pgxpool.Pool, _ idem.Key) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		if _, err := insertSignup(ctx, tx, signupUser.Add(1)); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}},
}

// signupDo is a sign-up through idem.Do.
func signupDo(ctx context.Context, pool *pgxpool.Pool, key idem.Key) error {
	user := signupUser.Add(1)
	_, err := idem.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (map[string]any, error) {
		id, err := insertSignup(ctx, tx, user)
		return map[string]any{"ok": true, "orderId": id}, err
	}, tableOpt)
	return err
}
