package idem

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestWithHoldTimeout(t *testing.T) {
	for _, d := range []time.Duration{0, -time.Second, maxHoldTimeout + time.Millisecond} {
		_, err := newConfig([]Option{WithHoldTimeout(d)})
		require.ErrorIs(t, err, ErrInvalidOption, "%v", d)
	}
	for _, d := range []time.Duration{time.Nanosecond, time.Second, maxHoldTimeout} {
		cfg, err := newConfig([]Option{WithHoldTimeout(d)})
		require.NoError(t, err, "%v", d)
		require.Equal(t, d, cfg.holdTimeout)
	}
	cfg, err := newConfig(nil)
	require.NoError(t, err)
	require.Zero(t, cfg.holdTimeout, "no bound by default")
}

func TestHoldMillis(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		time.Nanosecond:                    1,
		time.Millisecond:                   1,
		time.Millisecond + time.Nanosecond: 2,
		1500 * time.Millisecond:            1500,
		maxHoldTimeout:                     1<<31 - 1,
	} {
		require.Equal(t, want, holdMillis(d), "%v", d)
	}
}
