package idem

import (
	"errors"
	"fmt"
	"github.com/idemkit/idem/internal/protocol"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestWithHoldTimeout(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second, MaxHoldTimeout + time.Millisecond} {
		_, err := newConfig([]Option{WithHoldTimeout(d)})
		require.ErrorIs(t, err, ErrInvalidOption, "%v", d)
	}
	for _, d := range []time.Duration{time.Nanosecond, time.Second, MaxHoldTimeout} {
		cfg, err := newConfig([]Option{WithHoldTimeout(d)})
		require.NoError(t, err, "%v", d)
		require.Equal(t, d, cfg.HoldTimeout)
	}
	cfg, err := newConfig([]Option(nil))
	require.NoError(t, err)
	require.Zero(t, cfg.HoldTimeout, "no bound by default")
}

func TestHoldMillis(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		time.Nanosecond:                    1,
		time.Millisecond:                   1,
		time.Millisecond + time.Nanosecond: 2,
		1500 * time.Millisecond:            1500,
		MaxHoldTimeout:                     1<<31 - 1,
	} {
		require.Equal(t, want, protocol.HoldMillis(d), "%v", d)
	}
}

func TestHoldError(t *testing.T) {
	idle := &pgconn.PgError{Severity: "FATAL", Code: "25P03"}
	canceled := &pgconn.PgError{Code: "57014"}
	bounded := &config{HoldTimeout: time.Second, D: dialect}

	require.ErrorIs(t, bounded.HoldError(fmt.Errorf("fn: %w", idle)), ErrHoldTimeout)
	require.ErrorIs(t, bounded.HoldError(idle), idle)
	// Not the idle bound, or not idem's bound, or recorded: left as they are.
	for _, err := range []error{nil, canceled, errors.New("other"), Permanent(idle)} {
		require.Equal(t, err, bounded.HoldError(err))
	}
	require.Equal(t, error(idle), (&config{}).HoldError(idle))
}
