package idem

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNewConfigDefaults(t *testing.T) {
	t.Parallel()

	cfg, err := newConfig(nil)
	require.NoError(t, err)
	require.Equal(t, DefaultTTL, cfg.ttl)
	require.Equal(t, DefaultMaxResultSize, cfg.maxResult)
	require.Same(t, defaultQueries, cfg.q)
	require.Same(t, defaultInboxQueries, cfg.inbox)
	require.Nil(t, cfg.codec)
	require.Nil(t, cfg.hooks)
	require.False(t, cfg.noWait)
	require.False(t, cfg.requireIssued)
	require.Equal(t, RetryPolicy{MaxAttempts: 10, BaseDelay: 2 * time.Millisecond, MaxDelay: 250 * time.Millisecond}, cfg.retry)
}

func TestNewConfigAppliesOptions(t *testing.T) {
	t.Parallel()

	cfg, err := newConfig([]Option{
		WithTTL(time.Minute),
		NoWait(),
		RequireIssued(),
		WithCodec(JSONCodec{}),
		WithMaxResultSize(4096),
		WithRetry(RetryPolicy{MaxAttempts: 1}),
		WithTable("app", "keys"),
		WithInboxTable("app", "inbox"),
		nil, // ignored
	})
	require.NoError(t, err)
	require.Equal(t, time.Minute, cfg.ttl)
	require.True(t, cfg.noWait)
	require.True(t, cfg.requireIssued)
	require.Equal(t, JSONCodec{}, cfg.codec)
	require.Equal(t, 4096, cfg.maxResult)
	// Zero fields of a policy take their defaults.
	require.Equal(t, RetryPolicy{MaxAttempts: 1, BaseDelay: 2 * time.Millisecond, MaxDelay: 250 * time.Millisecond}, cfg.retry)
	require.Equal(t, `"app"."keys"`, cfg.q.table)
	require.Equal(t, `"app"."inbox"`, cfg.inbox.table)

	// WithMaxResultSize(0) and WithCodec(nil) restore the defaults.
	cfg, err = newConfig([]Option{WithMaxResultSize(4096), WithMaxResultSize(0), WithCodec(JSONCodec{}), WithCodec(nil)})
	require.NoError(t, err)
	require.Equal(t, DefaultMaxResultSize, cfg.maxResult)
	require.Nil(t, cfg.codec)
}

func TestNewConfigRejectsBadOptions(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		opt  Option
		msg  string
	}{
		{"zero TTL", WithTTL(0), "WithTTL(0s)"},
		{"negative TTL", WithTTL(-time.Second), "WithTTL(-1s)"},
		{"negative result size", WithMaxResultSize(-1), "WithMaxResultSize(-1)"},
		{"negative attempts", WithRetry(RetryPolicy{MaxAttempts: -1}), "WithRetry"},
		{"negative base delay", WithRetry(RetryPolicy{BaseDelay: -time.Millisecond}), "WithRetry"},
		{"negative max delay", WithRetry(RetryPolicy{MaxDelay: -time.Millisecond}), "WithRetry"},
		{"table with a dash", WithTable("", "a-b"), `table name "a-b"`},
		{"schema with a dot", WithTable("a.b", "t"), `schema name "a.b"`},
		{"inbox table with a quote", WithInboxTable("", `in"box`), `table name "in\"box"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := newConfig([]Option{tt.opt})
			require.ErrorIs(t, err, ErrInvalidOption)
			require.ErrorContains(t, err, tt.msg)
		})
	}
}

// The first bad option is the one reported; later options still apply but
// cannot hide it.
func TestNewConfigReportsTheFirstBadOption(t *testing.T) {
	t.Parallel()

	_, err := newConfig([]Option{WithTTL(time.Minute), WithTable("", "1bad"), WithTTL(-1), WithTable("", "good")})
	require.ErrorIs(t, err, ErrInvalidOption)
	require.ErrorContains(t, err, `"1bad"`)
	require.NotContains(t, err.Error(), "WithTTL")
}

func TestValidateTableNameLimits(t *testing.T) {
	t.Parallel()

	require.NoError(t, ValidateTableName(strings.Repeat("s", 63), strings.Repeat("t", 48)))
	require.NoError(t, ValidateTableName("", "T_1"))
	require.ErrorIs(t, ValidateTableName(strings.Repeat("s", 64), "t"), ErrInvalidOption)
	require.ErrorIs(t, ValidateTableName("", strings.Repeat("t", 49)), ErrInvalidOption)
	for _, bad := range []string{"", "1t", "t t", "t;", "été", "t\x00", `"t"`, "public.t"} {
		require.ErrorIs(t, ValidateTableName("", bad), ErrInvalidOption, "table %q", bad)
		if bad != "" { // an empty schema means the search_path
			require.ErrorIs(t, ValidateTableName(bad, "t"), ErrInvalidOption, "schema %q", bad)
		}
	}
}

func TestTableIdentQuotes(t *testing.T) {
	t.Parallel()

	require.Equal(t, `"idempotent_record"`, tableIdent("", DefaultTable))
	require.Equal(t, `"App"."Keys"`, tableIdent("App", "Keys"))
}

// Retry n waits at most min(MaxDelay, BaseDelay * 2^n).
func TestBackoffGrowsToMaxDelay(t *testing.T) {
	t.Parallel()

	p := RetryPolicy{MaxAttempts: 10, BaseDelay: time.Millisecond, MaxDelay: 50 * time.Millisecond}
	for retry := 1; retry < 12; retry++ {
		bound := min(p.MaxDelay, p.BaseDelay<<retry)
		var longest time.Duration
		for range 200 {
			d := backoff(p, retry)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, bound, "retry %d", retry)
			longest = max(longest, d)
		}
		// Full jitter: 200 draws from [0, bound] reach its upper half.
		require.Greater(t, longest, bound/2, "retry %d", retry)
	}
}
