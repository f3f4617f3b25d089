package idem_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/ident"
)

func TestKeyValidate(t *testing.T) {
	ok := []idem.Key{
		{Scope: "u", ID: "k"},
		{Scope: "tenant/7", ID: "550e8400-e29b-41d4-a716-446655440000"},
		{Scope: "用户", ID: "订单 42 ✓"},
		{Scope: strings.Repeat("s", 255), ID: strings.Repeat("é", 127)},
	}
	for _, k := range ok {
		require.NoError(t, k.Validate(), "%q", k)
	}
	bad := map[string]idem.Key{
		"empty id":       {Scope: "u"},
		"empty scope":    {ID: "k"},
		"long id":        {Scope: "u", ID: strings.Repeat("k", 256)},
		"long scope":     {Scope: strings.Repeat("s", 256), ID: "k"},
		"long multibyte": {Scope: "u", ID: strings.Repeat("é", 128)},
		"bad utf8":       {Scope: "u", ID: "\xff"},
		"truncated utf8": {Scope: "u", ID: "\xe4\xb8"},
		"nul":            {Scope: "u", ID: "a\x00"},
		"newline":        {Scope: "u", ID: "a\n"},
		"c1 control":     {Scope: "u", ID: "a\u0085"},
		"zero width":     {Scope: "u", ID: "a\u200d"},
		"bidi override":  {Scope: "u\u202e", ID: "k"},
		"private use":    {Scope: "u", ID: "\ue000"},
	}
	for name, k := range bad {
		err := k.Validate()
		require.ErrorIs(t, err, idem.ErrInvalidKey, name)
		var ike *idem.InvalidKeyError
		require.ErrorAs(t, err, &ike, name)
		require.NotEmpty(t, ike.Reason)
	}
}

func TestPermanent(t *testing.T) {
	require.NoError(t, idem.Permanent(nil))
	base := errors.New("no stock")
	err := idem.Permanent(base)
	require.ErrorIs(t, err, base)
	require.True(t, idem.IsPermanent(err))
	require.True(t, idem.IsPermanent(errors.Join(errors.New("x"), err)))
	require.False(t, idem.IsPermanent(base))
	require.Equal(t, "no stock", err.Error())
}

func TestIsRetryable(t *testing.T) {
	require.True(t, idem.IsRetryable(&pgconn.PgError{Code: "40001"}))
	require.True(t, idem.IsRetryable(errors.Join(errors.New("wrapped"), &pgconn.PgError{Code: "40P01"})))
	require.False(t, idem.IsRetryable(&pgconn.PgError{Code: "23505"}))
	require.False(t, idem.IsRetryable(errors.New("40001")))
	require.False(t, idem.IsRetryable(nil))
}

func TestOptionsAreValidated(t *testing.T) {
	require.NoError(t, ident.ValidateTable("", "idempotent_record"))
	require.NoError(t, ident.ValidateTable("app_1", "_keys"))
	for _, bad := range [][2]string{{"", ""}, {"", "a-b"}, {"", `a"b`}, {"", "1a"}, {"x y", "t"}, {"", strings.Repeat("t", 49)}} {
		require.Error(t, ident.ValidateTable(bad[0], bad[1]), "%q", bad)
		// A call given the names refuses them before any SQL.
		_, err := idem.Lookup(context.Background(), noSQL{t}, "s", "k", idem.WithTable(bad[0], bad[1]))
		require.ErrorIs(t, err, idem.ErrInvalidOption, "%q", bad)
	}
}
