package idemsql

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errBatchBeginTx refuses a batch queued with pgx.Batch.BeginTx.
var errBatchBeginTx = errors.New("idemsql: Batch.BeginTx is not supported through database/sql; use Begin or BeginTx")

// checkBatch refuses what the emulation cannot do: a batch that begins its
// own transaction (Batch.BeginTx queues the begin statement first).
func checkBatch(b *pgx.Batch) error {
	if len(b.QueuedQueries) > 0 {
		first := strings.ToLower(strings.TrimSpace(b.QueuedQueries[0].SQL))
		if first == "begin" || strings.HasPrefix(first, "begin ") {
			return errBatchBeginTx
		}
	}
	return nil
}

// batchResults runs a pgx.Batch's statements one at a time, in order: each
// Exec, Query or QueryRow runs the next one. Close runs the rest, calling
// their callbacks, like pgx's.
type batchResults struct {
	ctx context.Context
	q   querier
	b   *pgx.Batch
	i   int   // the next statement to run
	err error // the first error: a statement's or a callback's
	// failed reports that a statement failed: the ones after it do not
	// run, and a batch on a DB rolls back.
	failed bool
	closed bool
	open   *rows // the last Query's rows, closed before the next statement
	// end, for a batch on a DB, ends its transaction.
	end func(failed bool) error
}

var _ pgx.BatchResults = (*batchResults)(nil)

func newBatchResults(ctx context.Context, q querier, b *pgx.Batch) *batchResults {
	return &batchResults{ctx: ctx, q: q, b: b}
}

// settle closes the previous statement's rows and records their error.
func (br *batchResults) settle() {
	if br.open == nil {
		return
	}
	br.open.Close()
	if br.open.stmtErr != nil {
		br.failed = true
	}
	if br.open.err != nil && br.err == nil {
		br.err = br.open.err
	}
	br.open = nil
}

// next returns the next statement to run, or the error that prevents it.
func (br *batchResults) next() (*pgx.QueuedQuery, error) {
	br.settle()
	switch {
	case br.closed:
		return nil, errors.New("idemsql: batch already closed")
	case br.failed:
		return nil, br.err
	case br.i >= len(br.b.QueuedQueries):
		return nil, errors.New("idemsql: no more results in batch")
	}
	qq := br.b.QueuedQueries[br.i]
	br.i++
	return qq, nil
}

func (br *batchResults) fail(err error) {
	br.failed = true
	if br.err == nil {
		br.err = err
	}
}

// Exec runs the next statement and returns its command tag.
func (br *batchResults) Exec() (pgconn.CommandTag, error) {
	qq, err := br.next()
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := execOn(br.ctx, br.q, qq.SQL, qq.Arguments)
	if err != nil {
		br.fail(err)
	}
	return tag, err
}

// Query runs the next statement and returns its rows, which are closed at
// the latest when the next statement runs. Rows is never nil.
func (br *batchResults) Query() (pgx.Rows, error) {
	qq, err := br.next()
	if err != nil {
		return errorRows(err), err
	}
	rs, err := queryOn(br.ctx, br.q, qq.SQL, qq.Arguments)
	r := rs.(*rows)
	if err != nil {
		br.fail(err)
		return r, err
	}
	br.open = r
	return r, nil
}

// QueryRow runs the next statement; Scan reads its first row.
func (br *batchResults) QueryRow() pgx.Row {
	rs, _ := br.Query()
	return &row{rows: rs.(*rows)}
}

// Close runs the statements not run yet, calling their callbacks until one
// returns an error; after a callback's error the remaining statements still
// run (pgx has sent them already) but their callbacks are not called. A
// failed statement stops the rest. Close returns the first error, and the
// same error again when called again.
func (br *batchResults) Close() error {
	if br.closed {
		return br.err
	}
	qs := br.b.QueuedQueries
	for br.err == nil && !br.failed && br.i < len(qs) {
		before := br.i
		if fn := qs[br.i].Fn; fn != nil {
			if err := fn(br); err != nil && br.err == nil {
				br.err = err
			}
		}
		if br.i == before && br.err == nil && !br.failed {
			_, _ = br.Exec() // no callback, or one that read nothing
		}
	}
	br.settle()
	for !br.failed && br.i < len(qs) {
		qq := qs[br.i]
		br.i++
		if _, err := execOn(br.ctx, br.q, qq.SQL, qq.Arguments); err != nil {
			br.fail(err)
		}
	}
	br.closed = true
	if br.end != nil {
		if err := br.end(br.failed); err != nil && br.err == nil {
			br.err = mapErr(err)
		}
	}
	return br.err
}

// Tx returns nil: a batch through this package never begins a transaction.
func (br *batchResults) Tx() pgx.Tx { return nil }
