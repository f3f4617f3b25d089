package integration_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// A token is answered ErrTokenOtherScope only when it was issued for another
// scope. A made-up token, a token with a one-character typo (in its random
// part or its tag) and a token of the right shape that was never issued are
// unknown, through Do, WithIdempotency, Claim and the middleware; none of
// them runs fn or writes a record.
func TestTokenAnswers(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	req := idem.RequireIssued()

	mine, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
	require.NoError(t, err)
	theirs, err := idem.IssueToken(ctx, pool, "user:2", time.Hour, s.Opt)
	require.NoError(t, err)
	// A token of user:1 that was never issued: the shape of one, with
	// another random part. Only its record makes a token valid.
	unissued, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "DELETE FROM "+s.Records+" WHERE key = $1", unissued)
	require.NoError(t, err)

	typo := func(token string, i int) string {
		b := []byte(token)
		if b[i] == 'A' {
			b[i] = 'B'
		} else {
			b[i] = 'A'
		}
		return string(b)
	}
	unknown := map[string]string{
		"made up":               strings.Repeat("Q", 43) + ".AAAAAAAA",
		"made up, new size":     strings.Repeat("Q", 43) + ".AAAAAAAAAAAA",
		"typo in the random":    typo(mine, 10),
		"typo in the scope tag": typo(mine, 45),
		"typo in the check":     typo(mine, len(mine)-1),
		"never issued":          unissued,
		"not a token":           "order-17",
	}
	runs := func() int64 { return c.runs.Load() }

	check := func(t *testing.T, key idem.Key, want error) {
		t.Helper()
		before := runs()
		_, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt, req)
		requireTokenError(t, err, want, "Do")
		require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
			_, err := idem.WithIdempotency(ctx, tx, key, c.fn(key), s.Opt, req)
			requireTokenError(t, err, want, "WithIdempotency")
			// The caller's transaction is still usable.
			_, err = tx.Exec(ctx, "SELECT 1")
			return err
		}))
		_, _, err = idem.Claim[string](ctx, pool, key, time.Minute, s.Opt, req)
		requireTokenError(t, err, want, "Claim")
		require.Equal(t, before, runs(), "fn ran")
		require.Nil(t, s.ReadRecord(t, pool, key), "a record was written")
	}
	for name, id := range unknown {
		t.Run(name, func(t *testing.T) {
			check(t, idem.Key{Scope: "user:1", ID: id}, idem.ErrTokenUnknown)
		})
	}
	t.Run("issued for another scope", func(t *testing.T) {
		check(t, idem.Key{Scope: "user:1", ID: theirs}, idem.ErrTokenOtherScope)
		check(t, idem.Key{Scope: "user:2", ID: mine}, idem.ErrTokenOtherScope)
	})

	// Through the middleware: the detail the client reads says the same.
	h := &signupServer{s: s}
	srv := newHTTPServer(t, pool, h, idemhttp.Config{Options: []idem.DoOption{s.Opt, req}})
	for name, id := range unknown {
		r := post(t, srv.URL, "user:1", id, "http-"+name)
		require.Equal(t, http.StatusBadRequest, r.status, name)
		requireProblemDetail(t, r, "The Idempotency-Key is not a token this server issued: fetch one and send it as it was given.", name)
	}
	r := post(t, srv.URL, "user:1", theirs, "http-theirs")
	require.Equal(t, http.StatusBadRequest, r.status)
	requireProblemDetail(t, r, "The Idempotency-Key is a token issued to another caller: fetch one of your own.", "theirs")
	require.Zero(t, h.runs.Load(), "the handler ran for a rejected token")

	// The real tokens still work, each once, in its own scope.
	for _, k := range []idem.Key{{Scope: "user:1", ID: mine}, {Scope: "user:2", ID: theirs}} {
		first, err := idem.Do(ctx, pool, k, c.fn(k), s.Opt, req)
		require.NoError(t, err)
		require.False(t, first.Replayed)
		again, err := idem.Do(ctx, pool, k, c.fn(k), s.Opt, req)
		require.NoError(t, err)
		require.True(t, again.Replayed)
		require.Equal(t, 1, s.CountEffects(t, pool, k))
	}
}

func requireTokenError(t *testing.T, err, want error, via string) {
	t.Helper()
	require.ErrorIs(t, err, want, via)
	require.ErrorIs(t, err, idem.ErrTokenRejected, via)
	for _, other := range []error{idem.ErrTokenUnknown, idem.ErrTokenOtherScope, idem.ErrTokenExpired} {
		if other != want {
			require.NotErrorIs(t, err, other, via)
		}
	}
}

func requireProblemDetail(t *testing.T, r httpReply, detail, msg string) {
	t.Helper()
	var p struct {
		Detail string `json:"detail"`
	}
	require.NoError(t, json.Unmarshal([]byte(r.body), &p), msg)
	require.Equal(t, detail, p.Detail, msg)
}
