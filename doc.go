// Package idem makes writes happen exactly once, using only the PostgreSQL an
// application already has.
//
// A user double-clicks "Pay", a mobile client retries after a timeout, a
// message queue redelivers: with idem each of those either replays the first
// result or runs once, and never half-happens. The claim on an idempotency
// key is a row of the record table (idempotent_record, created by package
// [github.com/idemkit/idem/migrations]) written in the same transaction as the
// business write. Its primary key is the lock: a second request with the key
// waits for the first transaction and then replays its result, or runs if
// that transaction rolled back. The result commits with the business rows,
// and a dead client's transaction is rolled back by the server, so there is
// no lock TTL to tune and no stuck key.
//
// # Running a function once per key
//
// [Do] begins and commits a transaction of its own, sending BEGIN with the
// claim and the completion with COMMIT, and retries serialization failures:
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
// [WithIdempotency] does the same inside the caller's pgx.Tx, running fn in
// a savepoint. Duplicates get the first result back with Result.Replayed
// set. Results are stored as JSON unless [WithCodec] says otherwise;
// [Permanent] marks an error as an outcome to record and replay. A [Key]'s
// Scope names its owner (a user, a tenant), so one caller's key never
// replays another's result; its Fingerprint detects a key reused for a
// different request ([ErrKeyReused]).
//
// # Around that core
//
//   - [Claim] starts lease mode, for work outside a transaction (a payment
//     gateway): a committed claim with a lease and a fencing token
//     ([Lease.Attempt]), renewed by [Lease.KeepAlive], resumable from a
//     [Lease.Checkpoint], finished by [Lease.Complete] inside the business
//     transaction.
//   - [IssueToken] and [RequireIssued] accept only keys the server handed out.
//   - [StateMachine] moves business rows along allowed transitions with one
//     conditional UPDATE (PENDING → PAID), repeats being no-ops.
//   - [InsertOrGet] creates a row once per business key and returns the
//     existing one to duplicates.
//   - [ConsumeOnce] processes a queue message once per consumer.
//   - [Purge] and [Purger] delete expired records; [Lookup], [Stuck] and
//     [TableStats] look into the table; [WithHooks] reports every call.
//
// Package [github.com/idemkit/idem/idemhttp] provides the Idempotency-Key
// HTTP middleware and a client transport that retries with the same key;
// package [github.com/idemkit/idem/idemsql] is the same API on
// database/sql, where fn receives the *sql.Tx. Every decision about time
// (TTLs, leases) uses the database clock.
//
// # Options
//
// Options are scoped to the calls they apply to, so a meaningless one does
// not compile: Do takes every [DoOption] ([WithTxOptions], [WithRetry], and
// the rest); WithIdempotency takes [Option]s ([NoWait], [WithHoldTimeout],
// and the rest); Claim takes [KeyOption]s ([WithTTL], [WithCodec],
// [WithMaxResultSize], [RequireIssued], [WithHooks], and the table options);
// the calls that read or maintain the tables take [TableOption]s
// ([WithTable], [WithInboxTable]).
//
// # Examples
//
// The Example functions below run against PostgreSQL. The repository's
// example programs show the whole chain:
//
//   - [examples/quickstart]: an activity launch, 500 users and about 2,000
//     submissions with double clicks and retries, exactly one row per user;
//   - [examples/payment]: lease mode against a gateway that rejects stale
//     fencing tokens;
//   - [examples/orders]: an order service with WithIdempotency, a state
//     machine and consume-once payment events;
//   - [examples/signup] and [examples/lead]: web pages that make their key
//     when they open and resend a pending submission.
//
// The README is the guide, and the docs directory holds the depth: HTTP,
// operations, reliability, performance and scaling.
//
// [examples/quickstart]: https://github.com/idemkit/idem/tree/main/examples/quickstart
// [examples/payment]: https://github.com/idemkit/idem/tree/main/examples/payment
// [examples/orders]: https://github.com/idemkit/idem/tree/main/examples/orders
// [examples/signup]: https://github.com/idemkit/idem/tree/main/examples/signup
// [examples/lead]: https://github.com/idemkit/idem/tree/main/examples/lead
package idem
