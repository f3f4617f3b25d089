// Package chaos holds idem's chaos soak, a test that runs only with the
// build tag "chaos" because it restarts the PostgreSQL cluster it is pointed
// at and must not share it with other tests:
//
//	TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable \
//	    go test -tags chaos -race -count=1 -v ./integration/chaos -chaos.duration 60s
//
// Workers send requests whose keys mostly repeat through Do,
// WithIdempotency, lease mode (Claim and Complete) and the HTTP middleware,
// retrying each with the same key as a real client would, while a chaos loop
// terminates their backends, cancels their contexts, cuts connections at
// COMMIT (half right after forwarding it, so the transaction commits, half
// instead of forwarding it, so it rolls back: the client cannot tell which),
// and restarts PostgreSQL once in fast and once in
// immediate mode (pg_ctlcluster; -chaos.restart=false leaves the server
// alone, for a database the test cannot restart). A checker then reads the
// effects table, which has no unique constraint, and reports per key lost
// acknowledged writes, duplicates and unexpected effects, and how many
// ambiguous answers (ErrOutcomeUnknown, a cut COMMIT) the retries settled.
package chaos
