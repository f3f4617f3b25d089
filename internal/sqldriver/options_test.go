package sqldriver

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestTxOptions(t *testing.T) {
	o, set, err := TxOptions("idemsql", pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, true)
	require.NoError(t, err)
	require.Equal(t, sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true}, o)
	require.Empty(t, set)
	o, set, err = TxOptions("idemsql", pgx.TxOptions{IsoLevel: pgx.Serializable, DeferrableMode: pgx.Deferrable}, true)
	require.NoError(t, err)
	require.Equal(t, sql.LevelSerializable, o.Isolation)
	require.Equal(t, "SET TRANSACTION DEFERRABLE", set)
	_, _, err = TxOptions("idemsql", pgx.TxOptions{CommitQuery: "COMMIT AND CHAIN"}, true)
	require.Error(t, err)
	// MySQL has no deferrable mode; no options are the defaults.
	_, _, err = TxOptions("idemmysql", pgx.TxOptions{DeferrableMode: pgx.Deferrable}, false)
	require.ErrorContains(t, err, "PostgreSQL's")
	o, set, err = TxOptions("idemmysql", nil, false)
	require.NoError(t, err)
	require.Equal(t, sql.TxOptions{}, o)
	require.Empty(t, set)
}
