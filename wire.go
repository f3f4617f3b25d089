package idem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"sync"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/internal/knobs"
)

// The claim and the completion travel in batches of a few statements each. On
// a plain pgx connection they go below pgx.Batch, through pgconn's Batch, as
// statements prepared through the transaction (pgx's Conn.Prepare underneath):
// one round trip, as with pgx.Batch, without its pipeline bookkeeping, which
// made most of an execution's allocations. A wireBatch is used only where pgx.Batch would
// have done the same thing (see wireConn); anywhere else idem sends its
// statements through pgx.Batch.

// wireKey keys a connection's *wireState in its CustomData.
const wireKey = "github.com/idemkit/idem.wire"

// wireState is what idem keeps with a connection: whether it may carry wire
// batches (decided on first use), and the statements idem prepared on it.
type wireState struct {
	ok       bool
	prepared map[string]bool
}

// pgxPackages are the packages whose pgx.Tx implementations are known to be
// plain transactions of the connection their Conn method returns.
var pgxPackages = map[string]bool{
	reflect.TypeFor[pgx.Conn]().PkgPath():   true,
	reflect.TypeFor[pgxpool.Tx]().PkgPath(): true,
}

// wireConn returns the connection under tx when idem's statements may bypass
// pgx.Batch on it, and nil otherwise. They may when:
//   - tx is one of pgx's or pgxpool's own transactions (perhaps behind the
//     guard fn receives), not a wrapper that might watch its statements;
//   - the connection has no pgx tracer, which would not see them;
//   - its DefaultQueryExecMode is QueryExecModeCacheStatement (pgx's
//     default), which prepares named statements anyway. The other modes
//     exist for poolers and proxies that do not keep named statements.
func wireConn(tx pgx.Tx) (*pgx.Conn, *wireState) {
	if tx == nil || knobs.PgxBatch.Load() {
		return nil, nil
	}
	for {
		g, ok := tx.(*guardTx)
		if !ok {
			break
		}
		if g.closed.Load() {
			return nil, nil
		}
		tx = g.tx
	}
	t := reflect.TypeOf(tx)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if !pgxPackages[t.PkgPath()] {
		return nil, nil
	}
	conn := tx.Conn()
	if conn == nil || conn.IsClosed() {
		return nil, nil
	}
	data := conn.PgConn().CustomData()
	if data == nil {
		return nil, nil
	}
	st, _ := data[wireKey].(*wireState)
	if st == nil {
		cfg := conn.Config()
		st = &wireState{
			ok:       cfg.Tracer == nil && cfg.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement,
			prepared: map[string]bool{},
		}
		data[wireKey] = st
	}
	if !st.ok {
		return nil, nil
	}
	return conn, st
}

// wireArg is one parameter of a wire statement: a string, bytes or an
// integer, unboxed.
type wireArg struct {
	s    string
	b    []byte
	i    int64
	kind byte // 's', 'b' or 'i'
}

func argString(s string) wireArg { return wireArg{s: s, kind: 's'} }
func argBytes(b []byte) wireArg  { return wireArg{b: b, kind: 'b'} }
func argInt(i int64) wireArg     { return wireArg{i: i, kind: 'i'} }

// Limits of one wire batch, which carries at most a claim or a completion
// with the statements around it.
const (
	maxWireStmts  = 6
	maxWireParams = 16
)

// wireBatch is a batch of idem's statements for one round trip: below
// pgx.Batch on a connection wireConn allows, through pgx.Batch otherwise.
// Get one with newBatch or newBeginBatch and give it back with free.
type wireBatch struct {
	conn *pgx.Conn // below pgx.Batch, on conn; nil: through pgx.Batch
	st   *wireState
	b    pgconn.Batch
	n    int   // statements queued
	err  error // the first error while queuing

	// tx is the transaction the statements belong to. Below pgx.Batch,
	// each statement is prepared through it, which fails with ErrTxClosed
	// once tx has ended: its connection may belong to someone else by then.
	tx pgx.Tx
	// Through pgx.Batch: sent on tx, or on begin.conn after BEGIN, leaving
	// the transaction begun in began.
	pb    *pgx.Batch
	begin *beginOn
	began pgx.Tx

	// Per statement: where its first row goes (nil: not read), whether the
	// row starts with the claimed column, and whether a row came.
	rows        [maxWireStmts]*record
	withClaimed [maxWireStmts]bool
	found       [maxWireStmts]bool
	// tag is the command tag of the last statement.
	tag pgconn.CommandTag

	params  [maxWireParams][]byte
	formats [maxWireParams]int16
	np      int
	ints    [maxWireParams * 20]byte // integers in text form
	ni      int
}

var wirePool = sync.Pool{New: func() any { return new(wireBatch) }}

// newBatch returns a batch of statements for tx.
func newBatch(tx pgx.Tx) *wireBatch {
	w := wirePool.Get().(*wireBatch)
	w.tx = tx
	if w.conn, w.st = wireConn(tx); w.conn == nil {
		w.pb = &pgx.Batch{}
	}
	return w
}

// newBeginBatch returns a batch whose round trip begins a transaction on
// begin.conn first (through pgx.Batch, which makes the pgx.Tx).
func newBeginBatch(begin *beginOn) *wireBatch {
	w := wirePool.Get().(*wireBatch)
	w.begin, w.pb = begin, &pgx.Batch{}
	w.pb.BeginTx(begin.opts)
	return w
}

// free clears w, so that it holds no key or result, and pools it.
func (w *wireBatch) free() {
	*w = wireBatch{}
	wirePool.Put(w)
}

// len is the number of statements queued.
func (w *wireBatch) len() int { return w.n }

// binaryResults asks for every result column in binary form.
var binaryResults = []int16{pgx.BinaryFormatCode}

// queue adds the statement sql, prepared on the connection on first use,
// with args. When dst is set the statement's first row is decoded into it
// (a claim's columns when withClaimed, a record's otherwise).
func (w *wireBatch) queue(ctx context.Context, sql string, dst *record, withClaimed bool, args ...wireArg) {
	if w.err != nil {
		return
	}
	if w.n == maxWireStmts || w.np+len(args) > maxWireParams {
		w.err = fmt.Errorf("idem: internal error: a wire batch holds at most %d statements and %d parameters", maxWireStmts, maxWireParams)
		return
	}
	if w.pb != nil {
		w.queuePgx(sql, dst, withClaimed, args)
		return
	}
	// Named after its own text (pgx's convention for name == sql): pgx
	// keeps it with the connection, forgets it on Deallocate and
	// DeallocateAll, and prepares it again after that. Prepared through
	// tx, which refuses once it has ended (as SendBatch would), and
	// otherwise costs a map lookup, or a round trip the first time on a
	// connection.
	sd, err := w.tx.Prepare(ctx, sql, sql)
	if err != nil {
		w.err = err
		return
	}
	if !w.st.prepared[sql] {
		w.st.prepared[sql] = true
	}
	if len(sd.ParamOIDs) != len(args) {
		w.err = fmt.Errorf("idem: internal error: statement takes %d parameters, given %d", len(sd.ParamOIDs), len(args))
		return
	}
	start := w.np
	for i, a := range args {
		if err := w.encode(a, sd.ParamOIDs[i]); err != nil {
			w.err = err
			return
		}
	}
	var results []int16
	if len(sd.Fields) > 0 {
		results = binaryResults
	}
	w.b.ExecStatement(sd, w.params[start:w.np:w.np], w.formats[start:w.np:w.np], results)
	w.rows[w.n], w.withClaimed[w.n] = dst, withClaimed
	w.n++
}

// queuePgx is queue through pgx.Batch.
func (w *wireBatch) queuePgx(sql string, dst *record, withClaimed bool, args []wireArg) {
	values := make([]any, len(args))
	for i, a := range args {
		switch a.kind {
		case 's':
			values[i] = a.s
		case 'b':
			values[i] = a.b
		default:
			values[i] = a.i
		}
	}
	i := w.n
	q := w.pb.Queue(sql, values...)
	switch {
	case dst != nil:
		q.QueryRow(func(r pgx.Row) error {
			err := r.Scan(dst.scanTargets(withClaimed)...)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			w.found[i] = err == nil
			return err
		})
	default:
		q.Exec(func(tag pgconn.CommandTag) error {
			w.tag = tag
			return nil
		})
	}
	w.rows[w.n], w.withClaimed[w.n] = dst, withClaimed
	w.n++
}

// encode appends a to the parameters: bytea in binary form, the rest as
// text, which the server reads for any parameter type.
func (w *wireBatch) encode(a wireArg, oid uint32) error {
	var v []byte
	format := int16(pgx.TextFormatCode)
	switch {
	case a.kind == 'b' && oid == pgtype.ByteaOID:
		v, format = a.b, pgx.BinaryFormatCode
		if v == nil {
			v = []byte{} // nil would be NULL
		}
	case a.kind == 's' && oid != pgtype.ByteaOID:
		// A read-only view of the string: pgconn copies it into the
		// message before ExecBatch returns.
		v = unsafe.Slice(unsafe.StringData(a.s), len(a.s))
		if v == nil {
			v = []byte{}
		}
	case a.kind == 'i' && oid != pgtype.ByteaOID:
		end := len(strconv.AppendInt(w.ints[w.ni:w.ni], a.i, 10)) + w.ni
		v, w.ni = w.ints[w.ni:end:end], end
	default:
		return fmt.Errorf("idem: internal error: parameter of kind %q for type OID %d", a.kind, oid)
	}
	w.params[w.np], w.formats[w.np] = v, format
	w.np++
	return nil
}

// exec sends the batch and reads every result. It returns the first error:
// a server error (*pgconn.PgError), after which the server skipped the
// statements that followed, a connection failure, or a row it could not
// decode.
func (w *wireBatch) exec(ctx context.Context) error {
	if w.err != nil {
		return w.err
	}
	if w.pb != nil {
		var br pgx.BatchResults
		var conn *pgx.Conn
		if w.begin != nil {
			conn = w.begin.conn
			br = conn.SendBatch(ctx, w.pb)
			w.began = br.Tx()
		} else {
			conn = w.tx.Conn()
			br = w.tx.SendBatch(ctx, w.pb)
		}
		err := br.Close()
		if err != nil {
			// pgx.Batch uses the statements idem prepared on the
			// connection too (they are named after their text).
			forgetStale(conn, err)
		}
		return err
	}
	mrr := w.conn.PgConn().ExecBatch(ctx, &w.b)
	var first error
	for i := 0; mrr.NextResult(); i++ {
		rr := mrr.ResultReader()
		if i < w.n && w.rows[i] != nil && rr.NextRow() {
			w.found[i] = true
			if err := w.rows[i].decode(rr.Values(), w.withClaimed[i]); err != nil && first == nil {
				first = err
			}
		}
		tag, err := rr.Close()
		if err != nil && first == nil {
			first = err
		}
		w.tag = tag
	}
	if err := mrr.Close(); err != nil && first == nil {
		first = err
	}
	if first != nil {
		forgetStale(w.conn, first)
	}
	return first
}

// forgetStale deallocates every statement idem prepared on conn when the
// server no longer has one of them (SQLSTATE 26000, after a DISCARD or
// DEALLOCATE sent behind pgx's back) or refuses one whose result type changed
// under it (0A000, after the record table was altered), so that the next use
// prepares them again: the failing call returns its error, the next one
// works. Statements are named after their text, so pgx.Batch picks them up
// too, and its failures come here as well. Deallocation is a protocol
// message, which an aborted transaction accepts; a failure closes the
// connection.
func forgetStale(conn *pgx.Conn, err error) {
	switch pgCode(err) {
	case "26000", "0A000":
	default:
		return
	}
	if conn == nil || conn.IsClosed() {
		return
	}
	data := conn.PgConn().CustomData()
	if data == nil {
		return
	}
	st, _ := data[wireKey].(*wireState)
	if st == nil {
		return
	}
	ctx, cancel := cleanupContext(context.Background())
	defer cancel()
	for sql := range st.prepared {
		if conn.Deallocate(ctx, sql) != nil {
			return
		}
		delete(st.prepared, sql)
	}
}

// decode reads a row of claimColumns (withClaimed) or recordColumns in
// binary form into r.
func (r *record) decode(values [][]byte, withClaimed bool) error {
	if withClaimed {
		if len(values) != 8 {
			return fmt.Errorf("idem: claim returned %d columns, not 8", len(values))
		}
		r.claimed = len(values[0]) == 1 && values[0][0] == 1
		values = values[1:]
	}
	if len(values) != 7 || len(values[0]) != 4 {
		return fmt.Errorf("idem: unexpected record row (%d columns)", len(values))
	}
	r.attempt = int32(binary.BigEndian.Uint32(values[0]))
	switch s := values[1]; string(s) {
	case StatusProcessing:
		r.status = StatusProcessing
	case StatusSucceeded:
		r.status = StatusSucceeded
	case StatusFailed:
		r.status = StatusFailed
	case StatusIssued:
		r.status = StatusIssued
	default:
		r.status = string(s)
	}
	r.fingerprint = cloneBytes(values[2])
	r.response = cloneBytes(values[3])
	r.expired = len(values[4]) == 1 && values[4][0] == 1
	r.leased = len(values[5]) == 1 && values[5][0] == 1
	r.leaseLive = len(values[6]) == 1 && values[6][0] == 1
	return nil
}

// cloneBytes copies b out of the connection's read buffer; NULL stays nil.
func cloneBytes(b []byte) []byte {
	if b == nil {
		return nil
	}
	return append([]byte{}, b...)
}
