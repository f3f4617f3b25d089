package idem

import (
	"github.com/idemkit/idem/internal/protocol"

	"encoding/json"

	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestNewConfigDefaults(t *testing.T) {
	t.Parallel()

	cfg, err := newConfig([]Option(nil))
	require.NoError(t, err)
	require.Equal(t, DefaultTTL, cfg.TTL)
	require.Equal(t, DefaultMaxResultSize, cfg.MaxResult)
	require.Same(t, dialect.RecordsOf(protocol.DefaultRecords), cfg.Q)
	require.Same(t, dialect.InboxOf(protocol.DefaultInbox), cfg.Inbox)
	require.Nil(t, cfg.Codec)
	require.Nil(t, cfg.Hooks)
	require.False(t, cfg.NoWait)
	require.False(t, cfg.RequireIssued)
	require.Equal(t, protocol.Retry{MaxAttempts: 10, BaseDelay: 2 * time.Millisecond, MaxDelay: 250 * time.Millisecond, Outage: 15 * time.Second}, cfg.Retry)
}

func TestNewConfigAppliesOptions(t *testing.T) {
	t.Parallel()

	cfg, err := newConfig([]DoOption{
		WithTTL(time.Minute),
		NoWait(),
		RequireIssued(),
		WithCodec(testCodec{}),
		WithMaxResultSize(4096),
		WithRetry(RetryPolicy{MaxAttempts: 1}),
		WithTable("app", "keys"),
		WithInboxTable("app", "inbox"),
		nil, // ignored
	})
	require.NoError(t, err)
	require.Equal(t, time.Minute, cfg.TTL)
	require.True(t, cfg.NoWait)
	require.True(t, cfg.RequireIssued)
	require.Equal(t, testCodec{}, cfg.Codec)
	require.Equal(t, 4096, cfg.MaxResult)
	// Zero fields of a policy take their defaults.
	require.Equal(t, protocol.Retry{MaxAttempts: 1, BaseDelay: 2 * time.Millisecond, MaxDelay: 250 * time.Millisecond, Outage: 15 * time.Second}, cfg.Retry)
	require.Equal(t, `"app"."keys"`, cfg.Q.Table)
	require.Equal(t, `"app"."inbox"`, cfg.Inbox.Table)

	// WithMaxResultSize(0) and WithCodec(nil) restore the defaults.
	cfg, err = newConfig([]Option{WithMaxResultSize(4096), WithMaxResultSize(0), WithCodec(testCodec{}), WithCodec(nil)})
	require.NoError(t, err)
	require.Equal(t, DefaultMaxResultSize, cfg.MaxResult)
	require.Nil(t, cfg.Codec)
}

func TestNewConfigRejectsBadOptions(t *testing.T) {
	t.Parallel()

	tests := []struct {
		name string
		opt  DoOption
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
			_, err := newConfig([]DoOption{tt.opt})
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

func TestTableNameLimits(t *testing.T) {
	t.Parallel()

	valid := func(schema, table string) error {
		_, err := newConfig([]TableOption{WithTable(schema, table), WithInboxTable(schema, table)})
		return err
	}
	require.NoError(t, valid(strings.Repeat("s", 63), strings.Repeat("t", 48)))
	require.NoError(t, valid("", "T_1"))
	require.ErrorIs(t, valid(strings.Repeat("s", 64), "t"), ErrInvalidOption)
	require.ErrorIs(t, valid("", strings.Repeat("t", 49)), ErrInvalidOption)
	for _, bad := range []string{"", "1t", "t t", "t;", "été", "t\x00", `"t"`, "public.t"} {
		require.ErrorIs(t, valid("", bad), ErrInvalidOption, "table %q", bad)
		if bad != "" { // an empty schema means the search_path
			require.ErrorIs(t, valid(bad, "t"), ErrInvalidOption, "schema %q", bad)
		}
	}
}

// Each option is of the narrowest kind that holds every call it applies
// to, so that passing it to any other call does not compile.
func TestOptionKinds(t *testing.T) {
	t.Parallel()

	type kinds struct{ do, tx, key, table bool }
	kindOf := func(o DoOption) kinds {
		_, tx := o.(Option)
		_, key := o.(KeyOption)
		_, table := o.(TableOption)
		return kinds{do: true, tx: tx, key: key, table: table}
	}
	doOnly := kinds{do: true}
	withIdem := kinds{do: true, tx: true}
	claiming := kinds{do: true, tx: true, key: true}
	every := kinds{do: true, tx: true, key: true, table: true}
	for name, tc := range map[string]struct {
		opt  DoOption
		want kinds
	}{
		"WithTxOptions":     {WithTxOptions(pgx.TxOptions{}), doOnly},
		"WithRetry":         {WithRetry(RetryPolicy{}), doOnly},
		"NoWait":            {NoWait(), withIdem},
		"WithHoldTimeout":   {WithHoldTimeout(time.Second), withIdem},
		"WithTTL":           {WithTTL(time.Second), claiming},
		"WithCodec":         {WithCodec(nil), claiming},
		"WithMaxResultSize": {WithMaxResultSize(1), claiming},
		"RequireIssued":     {RequireIssued(), claiming},
		"WithHooks":         {WithHooks(nil), claiming},
		"WithTable":         {WithTable("", "t"), every},
		"WithInboxTable":    {WithInboxTable("", "t"), every},
		"a rejected table":  {WithTable("", "1t"), every},
	} {
		require.Equal(t, tc.want, kindOf(tc.opt), name)
	}
}

// testCodec is a Codec for the option tests.
type testCodec struct{}

func (testCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (testCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }
