// Package idemhttp puts idem behind HTTP: server middleware that follows the
// IETF draft "The Idempotency-Key HTTP Header Field"
// (draft-ietf-httpapi-idempotency-key-header-07), and a client Transport
// that sends a key and retries with it.
//
// # Server
//
// Middleware wraps a net/http handler (ServeMux, chi; echo and gin through
// their net/http adapters). For the configured methods it reads the
// Idempotency-Key header, derives the scope from the request (the
// authenticated caller) and a fingerprint of the request, and runs the
// handler once per (scope, key) inside a database transaction, which the
// handler reaches with Tx. The handler's response (status, allow-listed
// headers and body) is recorded in the same commit as the handler's writes
// and replayed, with Idempotent-Replayed: true, to every later request with
// the key.
//
//   - Missing key (when required) or malformed key: 400.
//   - A request with the key still in flight: 409 with Retry-After (or, with
//     Config.Wait, the request waits and gets the replay).
//   - The key reused with another request (method, path, query or body): 422.
//   - Responses 2xx-4xx are recorded, except 408, 409 and 429. A 5xx, one of
//     those three, or a panic rolls the transaction back and records nothing,
//     so a retry runs the handler again.
//   - A response larger than Config.MaxResponseBody: 500, nothing recorded.
//     Responses that are never recorded (5xx, 408, 409, 429) are not capped:
//     they go out whole.
//   - A handler whose SQL statement failed (which aborts the transaction)
//     and that then answers 4xx: the answer goes out as the handler wrote it
//     and nothing is recorded, since nothing can commit. Answering 2xx or 3xx
//     after a failed statement is a 500 ("handler-transaction-failed"):
//     none of the handler's writes committed, so its success would be false.
//   - A handler that leaves its transaction idle for longer than
//     Config.HoldTimeout (a minute by default): PostgreSQL ends the session,
//     a retry of the request runs the handler, and the hung request answers
//     503 with Retry-After.
//   - A handler whose transaction fails (a serialization failure, say) and
//     answers 5xx is not retried by the middleware: the client retries with
//     the same key.
//
// The middleware's own errors are RFC 9457 problem details
// (application/problem+json).
//
// Retention: a key's record is kept for Config.TTL (24 hours by default)
// after its first request, measured by the database clock; a request with the
// key after that runs the handler again. idem.Purge deletes expired records.
// Keys are scoped: the same key sent by two callers names two requests.
//
// # Client
//
// Transport adds a key to each request of the configured methods that has
// none, and retries connection errors, timeouts, 409, 429, 502, 503 and 504
// with the same key, so a request whose response was lost is answered from
// the record instead of running twice.
package idemhttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/pgerr"
)

// Config configures Middleware. Only Scope is required.
type Config struct {
	// Scope returns the owner of the request's keys: the authenticated user
	// or tenant. Keys never match across scopes, so one caller's key can
	// never replay another caller's response. An error answers 401 with a
	// detail that does not repeat the error's text. Required.
	Scope func(r *http.Request) (string, error)
	// Methods the middleware applies to. It defaults to POST and PATCH;
	// other requests pass through untouched.
	Methods []string
	// Optional lets requests without an Idempotency-Key through, without a
	// transaction (Tx returns nil), for gradual rollout. By default the key
	// is required and its absence answers 400.
	Optional bool
	// Fingerprint digests a request so that a key reused for another
	// request is refused (422). It defaults to DefaultFingerprint: SHA-256
	// over the method, the escaped path, the raw query and the body.
	Fingerprint func(r *http.Request, body []byte) []byte
	// RecordHeaders lists the response headers that are recorded and
	// replayed. The first response carries every header the handler set;
	// replays carry these. It defaults to Content-Type, Content-Language,
	// Location, Content-Location, Allow and WWW-Authenticate.
	// Content-Encoding is recorded whatever the list says: the recorded
	// body is encoded as it says, and means nothing without it.
	RecordHeaders []string
	// MaxRequestBody caps the request body read for the fingerprint. It
	// defaults to 1 MiB; a larger body answers 413.
	MaxRequestBody int64
	// MaxResponseBody caps the recorded response body. It defaults to 1 MiB;
	// a larger response answers 500 and nothing is recorded. The whole
	// recorded response (status, recorded headers and body) is capped at
	// MaxResponseBody plus 64 KiB through idem.WithMaxResultSize, which an
	// idem.WithMaxResultSize in Options overrides.
	MaxResponseBody int64
	// Wait makes a request whose key is in flight wait for the first one and
	// get its replay, instead of an immediate 409.
	Wait bool
	// RetryAfter is the Retry-After sent with a 409. It defaults to 1s.
	RetryAfter time.Duration
	// TTL is how long a record is kept and replayed. It defaults to 24h.
	TTL time.Duration
	// HoldTimeout bounds how long a request may hold its key while the
	// handler runs (idem.WithHoldTimeout). A handler that leaves its
	// transaction idle for longer than this (stuck on a call to another
	// service, say) has its session ended by PostgreSQL, which frees the
	// key for a retry of the request; the hung request then answers 503
	// with Retry-After (through database/sql with lib/pq, which hides the
	// server's reason, a 500), unless the handler, when it wakes, answers
	// an error of its own. A statement of the handler's that runs longer
	// than this fails (SQLSTATE 57014), and the handler answers as it does
	// for any failed statement. It defaults to DefaultHoldTimeout; a
	// negative value sets no bound; at most idem.MaxHoldTimeout. On MySQL
	// (the MySQL Driver) there is none, and a positive value is refused.
	HoldTimeout time.Duration
	// Options are passed to idem.Do (idem.WithTable, idem.WithTxOptions,
	// idem.RequireIssued, ...). Responses are stored in a compact binary
	// form of their own; a WithCodec here must handle the unexported
	// response type and is best left out.
	Options []idem.DoOption
}

// DefaultHoldTimeout is Config.HoldTimeout's default: longer than any web
// request should take.
const DefaultHoldTimeout = time.Minute

var defaultRecordHeaders = []string{"Content-Type", "Content-Language", "Location", "Content-Location", "Allow", "Www-Authenticate"}

// Middleware returns the idempotency middleware over db (normally a
// *pgxpool.Pool): New(Pgx(db), cfg). Handlers reach the request's
// transaction with Tx. It fails when Scope is missing or a size is negative.
func Middleware(db idem.TxBeginner, cfg Config) (func(http.Handler) http.Handler, error) {
	return New(Pgx(db), cfg)
}

// New returns the idempotency middleware over the database of d: Pgx for
// pgx (handlers reach the request's transaction with Tx), SQL for
// database/sql (SQLTx). It fails when d has no database, Scope is missing
// or a size is negative.
func New[TTx any](d Driver[TTx], cfg Config) (func(http.Handler) http.Handler, error) {
	if handle.Missing(d) || cfg.Scope == nil {
		return nil, fmt.Errorf("%w: idemhttp.Middleware needs a database and Config.Scope", idem.ErrInvalidOption)
	}
	if cfg.MaxRequestBody < 0 || cfg.MaxResponseBody < 0 || cfg.RetryAfter < 0 || cfg.TTL < 0 {
		// (HoldTimeout alone may be negative: no bound.)
		return nil, fmt.Errorf("%w: idemhttp.Config sizes and durations must not be negative", idem.ErrInvalidOption)
	}
	if cfg.HoldTimeout > idem.MaxHoldTimeout {
		return nil, fmt.Errorf("%w: idemhttp.Config.HoldTimeout %v is over idem.MaxHoldTimeout (%v)", idem.ErrInvalidOption, cfg.HoldTimeout, idem.MaxHoldTimeout)
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = []string{http.MethodPost, http.MethodPatch}
	}
	if cfg.Fingerprint == nil {
		cfg.Fingerprint = DefaultFingerprint
	}
	if cfg.RecordHeaders == nil {
		cfg.RecordHeaders = defaultRecordHeaders
	}
	cfg.RecordHeaders = slices.Clone(cfg.RecordHeaders) // canonicalised below: never the caller's slice
	if cfg.MaxRequestBody == 0 {
		cfg.MaxRequestBody = 1 << 20
	}
	if cfg.MaxResponseBody == 0 {
		cfg.MaxResponseBody = 1 << 20
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = time.Second
	}
	recordCap := int64(math.MaxInt)
	if cfg.MaxResponseBody < recordCap-responseOverhead {
		recordCap = cfg.MaxResponseBody + responseOverhead
	}
	if _, ok := any(d).(unbounded); ok {
		// The database has no hold timeout (MySQL): the default is none.
		if cfg.HoldTimeout > 0 {
			return nil, fmt.Errorf("%w: idemhttp.Config.HoldTimeout is not supported on this database", idem.ErrInvalidOption)
		}
		cfg.HoldTimeout = -1
	}
	if cfg.HoldTimeout == 0 {
		cfg.HoldTimeout = DefaultHoldTimeout
	}
	opts := []idem.DoOption{idem.WithMaxResultSize(int(recordCap))}
	if cfg.HoldTimeout > 0 {
		opts = append(opts, idem.WithHoldTimeout(cfg.HoldTimeout))
	}
	opts = append(opts, cfg.Options...)
	if cfg.TTL > 0 {
		opts = append(opts, idem.WithTTL(cfg.TTL))
	}
	if !cfg.Wait {
		opts = append(opts, idem.NoWait())
	}
	for i, h := range cfg.RecordHeaders {
		cfg.RecordHeaders[i] = http.CanonicalHeaderKey(h)
	}
	return func(next http.Handler) http.Handler {
		return &middleware[TTx]{d: d, cfg: cfg, opts: opts, next: next}
	}, nil
}

// responseOverhead is what a recorded response may add to its body: the
// status and the recorded headers.
const responseOverhead = 64 << 10

// DefaultFingerprint is SHA-256 over the method, the escaped path
// (r.URL.EscapedPath), the raw query, each followed by a NUL byte, and the
// body. The path is taken escaped so that requests the router tells apart
// ("/a%2Fb" and "/a/b") differ, and so that no field of a request net/http
// accepted holds a NUL byte (url.Parse refuses control characters): two
// different requests never have the same input.
func DefaultFingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	for _, s := range []string{r.Method, r.URL.EscapedPath(), r.URL.RawQuery} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	h.Write(body)
	return h.Sum(nil)
}

type txKey struct{}

// Tx returns the request's transaction inside a handler wrapped by
// Middleware (or New with Pgx), or nil when the request passed through
// without one. The handler must not commit or roll it back.
func Tx(ctx context.Context) pgx.Tx {
	tx, _ := ctx.Value(txKey{}).(pgx.Tx)
	return tx
}

type middleware[TTx any] struct {
	d    Driver[TTx]
	cfg  Config
	opts []idem.DoOption
	next http.Handler
}

// response is what is recorded and replayed.
type response struct {
	Status int                 `json:"status"`
	Header map[string][]string `json:"header,omitempty"`
	Body   []byte              `json:"body,omitempty"`
}

// notRecorded carries a response that must not be recorded (5xx, 408, 409,
// 429) out of idem.Do, which rolls the transaction back.
type notRecorded struct{ resp response }

func (e *notRecorded) Error() string {
	return fmt.Sprintf("idemhttp: status %d is not recorded", e.resp.Status)
}

var errTooLarge = errors.New("idemhttp: the response exceeds the recording limit")

// errHandlerTxFailed: the handler answered while its transaction was
// aborted by a failed statement.
var errHandlerTxFailed = errors.New("idemhttp: the handler's transaction failed")

// recordable reports whether a response with status is recorded: 2xx-4xx
// except 408, 409 and 429, which a client retries.
func recordable(status int) bool {
	return status < 500 && status != http.StatusRequestTimeout && status != http.StatusConflict && status != http.StatusTooManyRequests
}

func (m *middleware[TTx]) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !slices.Contains(m.cfg.Methods, r.Method) {
		m.next.ServeHTTP(w, r)
		return
	}
	key, err := ParseKey(r.Header)
	switch {
	case errors.Is(err, ErrNoKey) && m.cfg.Optional:
		m.next.ServeHTTP(w, r)
		return
	case errors.Is(err, ErrNoKey):
		problem(w, http.StatusBadRequest, "idempotency-key-missing", "This request needs an Idempotency-Key header.")
		return
	case err != nil:
		detail := "The Idempotency-Key header is not usable."
		var ke *KeyError
		if errors.As(err, &ke) {
			detail = ke.Detail
		}
		problem(w, http.StatusBadRequest, "idempotency-key-invalid", detail)
		return
	}
	scope, err := m.cfg.Scope(r)
	if err != nil {
		// The error's text stays on the server: it may describe internals.
		problem(w, http.StatusUnauthorized, "scope-unknown", "The caller could not be identified.")
		return
	}
	if err := (idem.Key{Scope: scope, ID: "x"}).Validate(); err != nil {
		problem(w, http.StatusInternalServerError, "scope-invalid", "The server derived an unusable scope for this caller.")
		return
	}
	limit := m.cfg.MaxRequestBody
	if limit < math.MaxInt64 {
		limit++ // one byte more tells "too large" from "exactly the limit"
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit))
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) || int64(len(body)) > m.cfg.MaxRequestBody {
		problem(w, http.StatusRequestEntityTooLarge, "body-too-large",
			fmt.Sprintf("The request body exceeds %d bytes.", m.cfg.MaxRequestBody))
		return
	}
	if err != nil {
		// The reader's error may describe the server's internals.
		problem(w, http.StatusBadRequest, "body-unreadable", "The request body could not be read to its end.")
		return
	}
	ikey := idem.Key{Scope: scope, ID: key, Fingerprint: m.cfg.Fingerprint(r, body)}

	var last *recorder // this request's latest execution of the handler
	res, err := m.d.Do(r.Context(), ikey, func(ctx context.Context, tx TTx) ([]byte, error) {
		rec := newRecorder(m.cfg.MaxResponseBody, w)
		rec.aborted = func() bool { return m.d.Aborted(tx) }
		last = rec
		req := r.WithContext(context.WithValue(ctx, txKey{}, tx))
		req.Body = io.NopCloser(bytes.NewReader(body))
		m.next.ServeHTTP(rec, req)
		if rec.tooLarge {
			return nil, errTooLarge
		}
		resp := rec.response(m.cfg.RecordHeaders)
		if !recordable(resp.Status) {
			resp.Header = rec.header // the client gets every header, as sent
			return nil, &notRecorded{resp: resp}
		}
		if m.d.Aborted(tx) {
			// A statement of the handler failed: nothing can commit
			// (database/sql, which cannot tell, fails at the completion
			// instead, with SQLSTATE 25P02, handled below).
			return nil, errHandlerTxFailed
		}
		return responseCodec{}.Marshal(resp)
	}, m.opts...)
	if last != nil && (errors.Is(err, errHandlerTxFailed) || pgerr.Code(err) == pgerr.InFailedTx) {
		resp := last.response(nil)
		if resp.Status >= 400 {
			// The handler rejected the request after a failed statement
			// (a unique violation answered 409 or 422, say): its answer
			// is right, and nothing is recorded.
			resp.Header = last.header
			err = &notRecorded{resp: resp}
		} else {
			err = errHandlerTxFailed
		}
	}

	var resp response
	if err == nil {
		err = responseCodec{}.Unmarshal(res.Value, &resp)
	}
	var nr *notRecorded
	switch {
	case err == nil:
		if res.Replayed {
			w.Header().Set(ReplayedHeader, "true")
		} else {
			resp.Header = last.header // the first answer goes out whole; replays get the recorded headers
		}
		writeResponse(w, resp)
	case errors.As(err, &nr):
		writeResponse(w, nr.resp)
	case errors.Is(err, errHandlerTxFailed):
		problem(w, http.StatusInternalServerError, "handler-transaction-failed",
			"A statement of the handler failed, so none of its writes committed, but the handler answered as if it had succeeded; nothing was recorded.")
	case errors.Is(err, errTooLarge), errors.Is(err, idem.ErrResultTooLarge):
		problem(w, http.StatusInternalServerError, "response-too-large",
			fmt.Sprintf("The response exceeds the %d bytes that can be recorded; nothing was recorded.", m.cfg.MaxResponseBody))
	case errors.Is(err, idem.ErrInProgress):
		w.Header().Set("Retry-After", strconv.Itoa(max(1, int(m.cfg.RetryAfter.Round(time.Second)/time.Second))))
		problem(w, http.StatusConflict, "request-in-progress", "A request with this Idempotency-Key is still being processed; retry later.")
	case errors.Is(err, idem.ErrKeyReused):
		problem(w, http.StatusUnprocessableEntity, "idempotency-key-reused", "This Idempotency-Key was used for a different request.")
	case errors.Is(err, idem.ErrTokenRejected):
		problem(w, http.StatusBadRequest, "token-rejected", tokenDetail(err))
	case errors.Is(err, idem.ErrInvalidKey):
		problem(w, http.StatusBadRequest, "idempotency-key-invalid", "The Idempotency-Key is not a usable key: send 1 to 255 printable ASCII characters.")
	case errors.Is(err, idem.ErrHoldTimeout):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "hold-timeout",
			"The request took longer than allowed and was rolled back; retry with the same Idempotency-Key.")
	case errors.Is(err, idem.ErrOutcomeUnknown):
		w.Header().Set("Retry-After", "1")
		problem(w, http.StatusServiceUnavailable, "outcome-unknown", "The outcome is unknown; retry with the same Idempotency-Key.")
	case idem.IsPermanent(err):
		problem(w, http.StatusInternalServerError, "failed", err.Error())
	default:
		problem(w, http.StatusInternalServerError, "internal", "The request could not be processed.")
	}
}

func writeResponse(w http.ResponseWriter, resp response) {
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// problem writes an RFC 9457 problem details object.
func problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type":   "about:blank",
		"title":  http.StatusText(status),
		"status": status,
		"detail": detail,
		"code":   code,
	})
}

// recorder buffers the handler's response. It flushes nothing (Flush is a
// no-op: the response goes out after the commit), cannot be hijacked, and
// passes deadlines and full duplex on to the real writer, so that
// http.ResponseController works on it.
type recorder struct {
	header   http.Header
	status   int
	body     bytes.Buffer
	limit    int64
	tooLarge bool
	w        http.ResponseWriter
	// aborted reports whether the handler's transaction failed: its
	// response can never be recorded, so it is not capped either.
	aborted func() bool
}

func newRecorder(limit int64, w http.ResponseWriter) *recorder {
	return &recorder{header: http.Header{}, limit: limit, w: w}
}

// Flush does nothing: the response is sent once the transaction is over.
func (rec *recorder) Flush() {}

// SetReadDeadline sets the real writer's read deadline (see
// http.ResponseController).
func (rec *recorder) SetReadDeadline(t time.Time) error {
	return http.NewResponseController(rec.w).SetReadDeadline(t)
}

// SetWriteDeadline sets the real writer's write deadline (see
// http.ResponseController).
func (rec *recorder) SetWriteDeadline(t time.Time) error {
	return http.NewResponseController(rec.w).SetWriteDeadline(t)
}

// EnableFullDuplex enables full duplex on the real writer (see
// http.ResponseController).
func (rec *recorder) EnableFullDuplex() error {
	return http.NewResponseController(rec.w).EnableFullDuplex()
}

func (rec *recorder) Header() http.Header { return rec.header }

func (rec *recorder) WriteHeader(status int) {
	if status >= 100 && status < 200 && status != http.StatusSwitchingProtocols {
		return // informational (103 Early Hints): not the response
	}
	if rec.status == 0 {
		rec.status = status
	}
}

func (rec *recorder) Write(p []byte) (int, error) {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	if int64(rec.body.Len()+len(p)) > rec.limit && recordable(rec.status) && (rec.aborted == nil || !rec.aborted()) {
		rec.tooLarge = true
		return 0, errTooLarge
	}
	return rec.body.Write(p)
}

func (rec *recorder) response(allow []string) response {
	status := rec.status
	if status == 0 {
		status = http.StatusOK
	}
	h := map[string][]string{}
	for _, k := range allow {
		if vs := rec.header.Values(k); len(vs) > 0 {
			h[k] = slices.Clone(vs)
		}
	}
	if vs := rec.header.Values("Content-Encoding"); len(vs) > 0 {
		h["Content-Encoding"] = slices.Clone(vs)
	}
	return response{Status: status, Header: h, Body: bytes.Clone(rec.body.Bytes())}
}

// tokenDetail says, for the client's developer, why a token was refused.
func tokenDetail(err error) string {
	switch {
	case errors.Is(err, idem.ErrTokenExpired):
		return "The Idempotency-Key is a token that has expired: fetch a new one."
	case errors.Is(err, idem.ErrTokenOtherScope):
		return "The Idempotency-Key is a token issued to another caller: fetch one of your own."
	default:
		return "The Idempotency-Key is not a token this server issued: fetch one and send it as it was given."
	}
}
