// Package idemgrpc puts idem behind gRPC: a unary server interceptor that
// runs a method's handler once per (caller, key) inside a database
// transaction and replays its recorded response, and a unary client
// interceptor that gives each call a key and retries it with that key. It
// gives gRPC methods the guarantees idemhttp gives HTTP handlers, over the
// same databases: pgx (Pgx), PostgreSQL through database/sql (SQL), and
// MySQL or MariaDB (MySQL).
//
// # Server
//
// UnaryServerInterceptor reads the key from the incoming metadata
// idempotency-key, asks Config.Scope for the caller, fingerprints the full
// method name and the request message, and calls idem.Do: the handler runs
// in the call's transaction, which it reaches with Tx (pgx) or SQLTx
// (database/sql), and its response message, or its error's status, is
// recorded in the same commit. Every later call with the key gets an equal
// message or status, with the header metadata idempotent-replayed: true.
//
//   - Missing key (when required) or malformed key: InvalidArgument.
//   - A call with the key still in flight: Aborted with a
//     google.rpc.RetryInfo detail (or, with Config.Wait, the call waits and
//     gets the replay).
//   - The key reused with another method or message: FailedPrecondition.
//   - OK and the codes of Config.RecordCodes (DefaultRecordCodes:
//     InvalidArgument, NotFound, AlreadyExists, PermissionDenied,
//     FailedPrecondition, OutOfRange) are recorded. Any other code, or a
//     panic, rolls the transaction back and records nothing, so a retry runs
//     the handler again.
//   - A response over Config.MaxResponseSize: Internal, nothing recorded.
//
// The interceptor's own errors carry a google.rpc.ErrorInfo detail whose
// domain is ErrorDomain and whose reason is one of the Reason constants.
// Streaming methods never reach a unary interceptor: they pass through
// untouched.
//
// # Client
//
// UnaryClientInterceptor adds a key to each call that has none (WithKey
// sets a chosen one) and retries Unavailable, DeadlineExceeded, Aborted and
// ResourceExhausted with the same key, honouring RetryInfo and the call's
// deadline. Its errors are *CallError values that carry the key.
package idemgrpc
