// Package knobs holds switches that benchmarks flip to measure design
// choices against each other. Applications have no reason to touch them.
package knobs

import "sync/atomic"

// UnpipelinedBegin makes Do send BEGIN on its own round trip instead of in the
// batch that carries the claim (the "end-only pipelining" variant).
var UnpipelinedBegin atomic.Bool

// PgxBatch makes idem send its statements through pgx.Batch even where it
// would send them below it (the path every connection with a tracer takes).
var PgxBatch atomic.Bool
