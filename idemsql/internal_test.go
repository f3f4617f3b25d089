package idemsql

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

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
