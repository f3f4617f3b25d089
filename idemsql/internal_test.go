package idemsql

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestTextArray(t *testing.T) {
	require.Equal(t, `{}`, textArray([]string{}))
	require.Equal(t, `{"PAID","SHIPPED"}`, textArray([]string{"PAID", "SHIPPED"}))
	require.Equal(t, `{"a,b","{x}","NULL","q\"uote","back\\slash"," s "}`,
		textArray([]string{"a,b", "{x}", "NULL", `q"uote`, `back\slash`, " s "}))

	args := []any{int64(1), []string{"A", "B"}, []string(nil), "s"}
	out := convertArgs(args)
	require.Equal(t, []any{int64(1), `{"A","B"}`, nil, "s"}, out)
	require.Equal(t, []string{"A", "B"}, args[1], "the caller's arguments are left alone")
	plain := []any{"x"}
	require.Equal(t, plain, convertArgs(plain))
}

func TestCommandVerb(t *testing.T) {
	for query, verb := range map[string]string{
		"UPDATE t SET x = 1":            "UPDATE",
		"  insert into t values (1)":    "INSERT",
		"-- note\nDELETE FROM t":        "DELETE",
		"/* a */ /* b */WITH x AS (..)": "WITH",
		"SAVEPOINT sp_1":                "SAVEPOINT",
		"-- only a comment":             "",
		"":                              "",
	} {
		require.Equal(t, verb, commandVerb(query), query)
	}
	require.EqualValues(t, 3, commandTag("UPDATE", 3).RowsAffected())
	require.Equal(t, "INSERT 0 2", commandTag("INSERT", 2).String())
}

func TestSQLTxOptions(t *testing.T) {
	o, set, err := sqlTxOptions(pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	require.NoError(t, err)
	require.Equal(t, sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}, o)
	require.Empty(t, set)
	o, set, err = sqlTxOptions(pgx.TxOptions{IsoLevel: pgx.Serializable, DeferrableMode: pgx.Deferrable})
	require.NoError(t, err)
	require.Equal(t, sql.LevelSerializable, o.Isolation)
	require.Equal(t, "SET TRANSACTION DEFERRABLE", set)
	_, _, err = sqlTxOptions(pgx.TxOptions{CommitQuery: "COMMIT AND CHAIN"})
	require.Error(t, err)
}
