package integration_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/integration/internal/pgtest"
)

// NoWait bounds the wait for a key's holder only: a lock on the whole record
// table (a migration's CREATE INDEX, LOCK TABLE) is waited for under the
// caller's lock_timeout, so a new key is claimed once it is gone rather than
// answered ErrInProgress, through Do and WithIdempotency, on every driver.
func TestNoWaitWaitsForATableLock(t *testing.T) {
	pool := pgtest.Pool(t)
	for _, d := range sqlDrivers {
		for _, viaDo := range []bool{true, false} {
			name := d.name + "/WithIdempotency"
			if viaDo {
				name = d.name + "/Do"
			}
			t.Run(name, func(t *testing.T) {
				ctx := context.Background()
				s := pgtest.NewSchema(t, pool)
				e := &sqlEnv{driver: d, pool: pool, s: s, db: d.open(t, pgtest.ClientURL(), 2)}
				locker, err := pool.Begin(ctx)
				require.NoError(t, err)
				defer locker.Rollback(ctx) //nolint:errcheck
				_, err = locker.Exec(ctx, `LOCK TABLE `+s.Records+` IN SHARE MODE`)
				require.NoError(t, err)

				key := sqlKey(t)
				fn := func(ctx context.Context, tx stx) (string, error) { return "v", e.effect(ctx, tx, key, "v") }
				done := make(chan error, 1)
				go func() {
					if viaDo {
						_, err := envDo(ctx, e.db, key, fn, s.Opt, idem.NoWait())
						done <- err
						return
					}
					done <- e.inTx(t, func(tx stx) error {
						_, err := envWith(ctx, tx, key, fn, s.Opt, idem.NoWait())
						return err
					})
				}()
				// The call waits on the table lock, past NoWait's bound (a
				// backend waits for a lock in a statement naming the
				// schema), and claims the key once the lock is gone.
				require.NoError(t, awaitBackend(ctx, pgtest.Direct(t), "wait_event_type = 'Lock'", s.Name))
				require.NoError(t, locker.Commit(ctx))
				require.NoError(t, <-done)
				require.Equal(t, 1, s.CountEffects(t, pool, key))
			})
		}
	}
}
