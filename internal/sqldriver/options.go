package sqldriver

import (
	"database/sql"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// TxOptions maps idem.WithTxOptions' pgx.TxOptions (opts, or nil) to
// database/sql's, with the statement that sets what sql.TxOptions cannot
// express: a deferrable mode, where deferrable allows one (PostgreSQL).
// name is the front's package, for messages.
func TxOptions(name string, opts any, deferrable bool) (sql.TxOptions, string, error) {
	o, _ := opts.(pgx.TxOptions)
	var s sql.TxOptions
	if o.BeginQuery != "" || o.CommitQuery != "" {
		return s, "", fmt.Errorf("%s: TxOptions.BeginQuery and CommitQuery are not supported through database/sql", name)
	}
	switch o.IsoLevel {
	case "":
		s.Isolation = sql.LevelDefault
	case pgx.Serializable:
		s.Isolation = sql.LevelSerializable
	case pgx.RepeatableRead:
		s.Isolation = sql.LevelRepeatableRead
	case pgx.ReadCommitted:
		s.Isolation = sql.LevelReadCommitted
	case pgx.ReadUncommitted:
		s.Isolation = sql.LevelReadUncommitted
	default:
		return s, "", fmt.Errorf("%s: unknown isolation level %q", name, o.IsoLevel)
	}
	switch o.AccessMode {
	case "", pgx.ReadWrite:
	case pgx.ReadOnly:
		s.ReadOnly = true
	default:
		return s, "", fmt.Errorf("%s: unknown access mode %q", name, o.AccessMode)
	}
	switch {
	case o.DeferrableMode == "":
		return s, "", nil
	case !deferrable:
		return s, "", fmt.Errorf("%s: TxOptions.DeferrableMode is PostgreSQL's", name)
	case o.DeferrableMode == pgx.Deferrable:
		return s, "SET TRANSACTION DEFERRABLE", nil
	case o.DeferrableMode == pgx.NotDeferrable:
		return s, "SET TRANSACTION NOT DEFERRABLE", nil
	}
	return s, "", fmt.Errorf("%s: unknown deferrable mode %q", name, o.DeferrableMode)
}
