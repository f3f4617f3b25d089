package integration_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// receipt holds what JSON does not keep as it is: a time in a named zone,
// a number in an interface, a nil slice, an empty map.
type receipt struct {
	At      time.Time
	Amount  any
	Items   []string
	Labels  map[string]string
	Message string
}

// notDecodable encodes but cannot be decoded: JSON cannot fill an error.
type notDecodable struct{ Err error }

func newReceipt(t *testing.T) receipt {
	paris, err := time.LoadLocation("Europe/Paris")
	require.NoError(t, err)
	return receipt{
		At:      time.Date(2026, 12, 1, 23, 30, 0, 123456789, paris),
		Amount:  int64(1999),
		Items:   nil,
		Labels:  map[string]string{},
		Message: "you are in",
	}
}

// The first execution returns the value its record replays: the caller sees
// the same Result.Value (reflect.DeepEqual) every time, through Do,
// and WithIdempotency.
func TestFirstValueEqualsReplay(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	fn := func(context.Context, pgx.Tx) (receipt, error) { return newReceipt(t), nil }

	// The value fn returns does not survive JSON: a first execution that
	// returned it as it is would differ from its replays.
	var roundTrip receipt
	data, err := json.Marshal(newReceipt(t))
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(data, &roundTrip))
	require.False(t, reflect.DeepEqual(newReceipt(t), roundTrip), "the receipt must not survive JSON for this test to mean anything")

	check := func(t *testing.T, first, again idem.Result[receipt]) {
		t.Helper()
		require.False(t, first.Replayed)
		require.True(t, again.Replayed)
		require.True(t, reflect.DeepEqual(first.Value, again.Value), "first %#v\nreplay %#v", first.Value, again.Value)
		require.Equal(t, float64(1999), first.Value.Amount, "JSON's number, on the first execution too")
	}

	t.Run("Do", func(t *testing.T) {
		key := newKey(t)
		first, err := idem.Do(ctx, pool, key, fn, s.Opt)
		require.NoError(t, err)
		again, err := idem.Do(ctx, pool, key, fn, s.Opt)
		require.NoError(t, err)
		check(t, first, again)
	})
	t.Run("WithIdempotency", func(t *testing.T) {
		key := newKey(t)
		var first, again idem.Result[receipt]
		require.NoError(t, inTx(t, pool, "", func(tx pgx.Tx) (err error) {
			first, err = idem.WithIdempotency(ctx, tx, key, fn, s.Opt)
			return err
		}))
		require.NoError(t, inTx(t, pool, "", func(tx pgx.Tx) (err error) {
			again, err = idem.WithIdempotency(ctx, tx, key, fn, s.Opt)
			return err
		}))
		check(t, first, again)
	})
	t.Run("nil and empty bytes", func(t *testing.T) {
		key := newKey(t)
		nilBytes := func(context.Context, pgx.Tx) ([]byte, error) { return nil, nil }
		first, err := idem.Do(ctx, pool, key, nilBytes, s.Opt)
		require.NoError(t, err)
		again, err := idem.Do(ctx, pool, key, nilBytes, s.Opt)
		require.NoError(t, err)
		require.True(t, reflect.DeepEqual(first.Value, again.Value), "first %#v, replay %#v", first.Value, again.Value)
	})
	t.Run("not decodable", func(t *testing.T) {
		// Recorded, it would fail every replay: it is refused and rolled
		// back instead, and the key stays free.
		key := newKey(t)
		_, err := idem.Do(ctx, pool, key, func(ctx context.Context, tx pgx.Tx) (notDecodable, error) {
			return notDecodable{Err: errors.New("declined")}, s.AddEffect(ctx, tx, key, "x")
		}, s.Opt)
		require.ErrorContains(t, err, "does not decode")
		require.Nil(t, s.ReadRecord(t, pool, key))
		require.Zero(t, s.CountEffects(t, pool, key))
	})
}
