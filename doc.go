// Package idem makes writes happen once, using only the PostgreSQL an
// application already has.
//
// The claim on an idempotency key is a row of the record table
// (idempotent_record, created by the migrations package) written in the same
// transaction as the business write. PostgreSQL's unique index is the lock:
// a second request with the key waits for the first transaction and then
// replays its result, or runs if that transaction rolled back. When the
// transaction commits, the result is recorded with the business write; when
// it rolls back (an error, a panic, a cancelled context, a dead connection),
// the claim is gone too. Nothing can half-happen, and there is no lock TTL to
// tune.
//
// Two entry points run a function once per Key:
//
//   - WithIdempotency runs fn inside the caller's pgx.Tx, in a savepoint, and
//     records the result in that transaction.
//   - Do begins and commits a transaction of its own, pipelining BEGIN with
//     the claim and the completion with COMMIT, and retries serialization
//     failures.
//
// Duplicates get the first result back with Result.Replayed set. Results are
// stored as JSON by default (WithCodec changes that); Permanent marks an
// error as a business outcome to record and replay. A Key's Scope names its
// owner (a user, a tenant), so one caller's key never replays another's
// result; its Fingerprint detects a key reused for a different request
// (ErrKeyReused).
//
// Basic use, in a handler that received an Idempotency-Key:
//
//	res, err := idem.Do(ctx, pool, idem.Key{Scope: userID, ID: idempotencyKey},
//		func(ctx context.Context, tx pgx.Tx) (Receipt, error) {
//			return createOrder(ctx, tx, req) // runs once per key
//		})
//	switch {
//	case errors.Is(err, idem.ErrInProgress): // 409, with NoWait
//	case errors.Is(err, idem.ErrKeyReused): // 422
//	case err != nil: // 500
//	default: // res.Value, res.Replayed
//	}
//
// See ExampleWithIdempotency and ExampleDo for programs that run.
package idem
