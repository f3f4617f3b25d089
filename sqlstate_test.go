package idem_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// driverError is an error of a driver other than pgx that carries a
// SQLSTATE, as lib/pq's *pq.Error does.
type driverError struct{ code string }

func (e *driverError) Error() string    { return "pq: " + e.code }
func (e *driverError) SQLState() string { return e.code }

func TestIsRetryableAnyDriver(t *testing.T) {
	t.Parallel()

	for _, err := range []error{
		&driverError{"40001"},
		&driverError{"40P01"},
		fmt.Errorf("committing: %w", &driverError{"40001"}),
	} {
		require.True(t, idem.IsRetryable(err), "%v", err)
	}
	for _, err := range []error{
		&driverError{"23505"},
		&driverError{"55P03"}, // lock_timeout: not a serialization failure
		&pgconn.PgError{Code: "57014"},
		errors.New("serialization failure"),
	} {
		require.False(t, idem.IsRetryable(err), "%v", err)
	}
}

func TestUniqueViolation(t *testing.T) {
	t.Parallel()

	name, ok := idem.UniqueViolation(fmt.Errorf("inserting: %w", &pgconn.PgError{Code: "23505", ConstraintName: "signups_user_id_key"}))
	require.True(t, ok)
	require.Equal(t, "signups_user_id_key", name)

	// Another driver's error tells the SQLSTATE, not the constraint.
	name, ok = idem.UniqueViolation(&driverError{"23505"})
	require.True(t, ok)
	require.Empty(t, name)

	for _, err := range []error{nil, errors.New("23505"), &pgconn.PgError{Code: "23503", ConstraintName: "fk"}, &driverError{"40001"}} {
		name, ok := idem.UniqueViolation(err)
		require.False(t, ok, "%v", err)
		require.Empty(t, name)
	}
}
