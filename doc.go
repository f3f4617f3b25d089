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
// Around that core:
//
//   - Claim starts lease mode, for work outside a transaction (a payment
//     gateway): a committed claim with a lease and a fencing token
//     (Lease.Attempt), renewed by Extend or KeepAlive, resumable from a
//     Checkpoint, finished by Complete inside the business transaction.
//   - IssueToken and RequireIssued accept only keys the server handed out.
//   - StateMachine moves business rows along allowed transitions with one
//     conditional UPDATE (PENDING → PAID), repeats being no-ops.
//   - InsertOrGet creates a row once per business key and returns the
//     existing one to duplicates.
//   - ConsumeOnce processes a queue message once per consumer.
//   - Purge and Purger delete expired records.
//
// Options are scoped to the calls they apply to, so a meaningless one does
// not compile: Do takes every DoOption (WithTxOptions, WithRetry, and the
// rest); WithIdempotency takes Options (NoWait, WithHoldTimeout, and the
// rest); Claim takes KeyOptions (WithTTL, WithCodec, WithMaxResultSize,
// RequireIssued, WithHooks, and the table options); the calls that read or
// maintain the tables take TableOptions (WithTable, WithInboxTable).
//
// The migrations package creates the tables; package idemhttp provides the
// Idempotency-Key HTTP middleware and a retrying client transport. Every
// decision about time (TTLs, leases) uses the database clock.
//
// The Example functions are programs that run against PostgreSQL.
package idem
