package idemhttp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

// beginFunc is a TxBeginner made of a function.
type beginFunc func(ctx context.Context) (pgx.Tx, error)

func (f beginFunc) Begin(ctx context.Context) (pgx.Tx, error) { return f(ctx) }

// noDatabase fails the test if the middleware begins a transaction.
func noDatabase(t *testing.T) idem.TxBeginner {
	return beginFunc(func(context.Context) (pgx.Tx, error) {
		t.Error("the middleware began a transaction")
		return nil, errors.New("no database")
	})
}

func scopeHeader(r *http.Request) (string, error) { return r.Header.Get("X-User"), nil }

func TestMiddlewareConfigIsValidated(t *testing.T) {
	t.Parallel()

	db := noDatabase(t)
	tests := []struct {
		name string
		db   idem.TxBeginner
		cfg  Config
	}{
		{"no database", nil, Config{Scope: scopeHeader}},
		{"no Scope", db, Config{}},
		{"negative MaxRequestBody", db, Config{Scope: scopeHeader, MaxRequestBody: -1}},
		{"negative MaxResponseBody", db, Config{Scope: scopeHeader, MaxResponseBody: -1}},
		{"negative RetryAfter", db, Config{Scope: scopeHeader, RetryAfter: -time.Second}},
		{"negative TTL", db, Config{Scope: scopeHeader, TTL: -time.Second}},
		{"HoldTimeout over the maximum", db, Config{Scope: scopeHeader, HoldTimeout: idem.MaxHoldTimeout + time.Millisecond}},
	}
	for _, tt := range tests {
		mw, err := Middleware(tt.db, tt.cfg)
		require.ErrorIs(t, err, idem.ErrInvalidOption, tt.name)
		require.Nil(t, mw, tt.name)
	}
}

func TestMiddlewareConfigDefaults(t *testing.T) {
	t.Parallel()

	mw, err := Middleware(noDatabase(t), Config{Scope: scopeHeader})
	require.NoError(t, err)
	cfg := mw(http.NotFoundHandler()).(*middleware[pgx.Tx]).cfg
	require.Equal(t, []string{http.MethodPost, http.MethodPatch}, cfg.Methods)
	require.Equal(t, int64(1<<20), cfg.MaxRequestBody)
	require.Equal(t, int64(1<<20), cfg.MaxResponseBody)
	require.Equal(t, time.Second, cfg.RetryAfter)
	require.Equal(t, DefaultHoldTimeout, cfg.HoldTimeout)
	require.NotNil(t, cfg.Fingerprint)
	require.Equal(t, defaultRecordHeaders, cfg.RecordHeaders)

	// Record headers are canonicalised in a copy: the caller's slice is left alone.
	mine := []string{"x-request-id", "content-type"}
	mw, err = Middleware(noDatabase(t), Config{Scope: scopeHeader, RecordHeaders: mine})
	require.NoError(t, err)
	cfg = mw(http.NotFoundHandler()).(*middleware[pgx.Tx]).cfg
	require.Equal(t, []string{"X-Request-Id", "Content-Type"}, cfg.RecordHeaders)
	require.Equal(t, []string{"x-request-id", "content-type"}, mine)
}

// problemBody is an RFC 9457 problem details object as the middleware writes it.
type problemBody struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Code   string `json:"code"`
}

// serve sends req through the middleware over db and returns the answer and
// whether the next handler ran (and saw a transaction).
func serve(t *testing.T, db idem.TxBeginner, cfg Config, req *http.Request) (resp *http.Response, ran, hadTx bool) {
	t.Helper()
	if cfg.Scope == nil {
		cfg.Scope = scopeHeader
	}
	mw, err := Middleware(db, cfg)
	require.NoError(t, err)
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran, hadTx = true, Tx(r.Context()) != nil
		w.WriteHeader(http.StatusTeapot)
	})
	rec := httptest.NewRecorder()
	mw(next).ServeHTTP(rec, req)
	return rec.Result(), ran, hadTx
}

func readProblem(t *testing.T, resp *http.Response) problemBody {
	t.Helper()
	require.Equal(t, "application/problem+json", resp.Header.Get("Content-Type"))
	var p problemBody
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&p))
	require.Equal(t, resp.StatusCode, p.Status)
	require.Equal(t, "about:blank", p.Type)
	require.Equal(t, http.StatusText(resp.StatusCode), p.Title)
	return p
}

// Requests the middleware answers, or passes on, before it needs the
// database: other methods, a missing or malformed key, an unknown caller,
// a body too large.
func TestMiddlewareAnswersBeforeTheDatabase(t *testing.T) {
	t.Parallel()

	post := func(body string, headers ...string) *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/signups", strings.NewReader(body))
		for i := 0; i+1 < len(headers); i += 2 {
			r.Header.Add(headers[i], headers[i+1])
		}
		return r
	}
	scopeFails := func(*http.Request) (string, error) { return "", errors.New("token expired for secret-user") }
	scopeEmpty := func(*http.Request) (string, error) { return "", nil }

	tests := []struct {
		name   string
		cfg    Config
		req    *http.Request
		status int    // the middleware's answer, or 418 from the handler
		code   string // the problem's code
		detail string // a part of the problem's detail
	}{
		{"GET passes", Config{}, httptest.NewRequest(http.MethodGet, "/signups", nil), http.StatusTeapot, "", ""},
		{"PUT passes by default", Config{}, httptest.NewRequest(http.MethodPut, "/signups", nil), http.StatusTeapot, "", ""},
		{"POST passes when not configured", Config{Methods: []string{http.MethodPut}}, post("x"), http.StatusTeapot, "", ""},
		{"no key", Config{}, post("x"), http.StatusBadRequest, "idempotency-key-missing", "needs an Idempotency-Key header"},
		{"no key, Optional", Config{Optional: true}, post("x"), http.StatusTeapot, "", ""},
		{"malformed key", Config{}, post("x", HeaderName, `"unterminated`), http.StatusBadRequest, "idempotency-key-invalid", "The quoted key has no closing quote."},
		{"malformed key, Optional", Config{Optional: true}, post("x", HeaderName, `a b`), http.StatusBadRequest, "idempotency-key-invalid", `The key contains a space at position 2 of the header's value: send a key with spaces as a quoted string, such as "a b".`},
		{"two keys", Config{}, post("x", HeaderName, `"a"`, HeaderName, `"b"`), http.StatusBadRequest, "idempotency-key-invalid", "The request has 2 Idempotency-Key headers: send exactly one."},
		{"a list of keys", Config{}, post("x", HeaderName, `"a", "b"`), http.StatusBadRequest, "idempotency-key-invalid", "The Idempotency-Key header holds a list"},
		{"a bare list in one header", Config{}, post("x", HeaderName, `a,b`), http.StatusBadRequest, "idempotency-key-invalid",
			`The Idempotency-Key header holds a list (members separated by a comma): its value must be one key. A key that contains a comma must be sent as a quoted string, such as "a,b".`},
		{"a key over 255 bytes", Config{}, post("x", HeaderName, strings.Repeat("k", 256)), http.StatusBadRequest, "idempotency-key-invalid", "The key is 256 bytes long: it must be 1 to 255."},
		{"a non-ASCII key", Config{}, post("x", HeaderName, "caf\xc3\xa9"), http.StatusBadRequest, "idempotency-key-invalid", "The key contains a byte outside ASCII at position 4 of the header's value: a key is printable ASCII."},
		{"Scope fails", Config{Scope: scopeFails}, post("x", HeaderName, `"k"`), http.StatusUnauthorized, "scope-unknown", ""},
		{"Scope is empty", Config{Scope: scopeEmpty}, post("x", HeaderName, `"k"`), http.StatusInternalServerError, "scope-invalid", ""},
		{"Scope is not printable", Config{}, post("x", HeaderName, `"k"`, "X-User", "u\x7f"), http.StatusInternalServerError, "scope-invalid", ""},
		{"body over the limit", Config{MaxRequestBody: 4}, post("12345", HeaderName, `"k"`, "X-User", "u"), http.StatusRequestEntityTooLarge, "body-too-large", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, ran, hadTx := serve(t, noDatabase(t), tt.cfg, tt.req)
			require.Equal(t, tt.status, resp.StatusCode)
			if tt.code == "" {
				require.True(t, ran, "the handler did not run")
				require.False(t, hadTx, "a request passed through has no transaction")
				return
			}
			require.False(t, ran, "the handler ran")
			p := readProblem(t, resp)
			require.Equal(t, tt.code, p.Code)
			require.Contains(t, p.Detail, tt.detail)
			require.NotContains(t, p.Detail, "idemhttp:", "a detail is for the client's developer, not Go error text")
			require.NotContains(t, p.Detail, "secret-user", "the Scope error's text stays on the server")
		})
	}
}

// A body of exactly MaxRequestBody bytes is accepted; a body that cannot be
// read is a 400.
func TestMiddlewareRequestBody(t *testing.T) {
	t.Parallel()

	var begun []string
	db := beginFunc(func(ctx context.Context) (pgx.Tx, error) {
		begun = append(begun, "begin")
		return nil, errors.New("dial tcp 10.0.0.7:5432: connection refused")
	})
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("1234"))
	req.Header.Set(HeaderName, `"k"`)
	req.Header.Set("X-User", "u")
	resp, ran, _ := serve(t, db, Config{MaxRequestBody: 4}, req)
	require.Equal(t, []string{"begin"}, begun)
	require.False(t, ran)
	// The database's error is the server's business: a plain 500.
	require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
	p := readProblem(t, resp)
	require.Equal(t, "internal", p.Code)
	require.NotContains(t, p.Detail, "10.0.0.7")

	req = httptest.NewRequest(http.MethodPost, "/", io.MultiReader(strings.NewReader("12"), errReader{}))
	req.Header.Set(HeaderName, `"k"`)
	req.Header.Set("X-User", "u")
	resp, ran, _ = serve(t, noDatabase(t), Config{}, req)
	require.False(t, ran)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Equal(t, "body-unreadable", readProblem(t, resp).Code)
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("client went away") }

// DefaultFingerprint tells apart requests that differ in method, escaped
// path, query or body, and nothing else.
func TestDefaultFingerprint(t *testing.T) {
	t.Parallel()

	fp := func(method, target, body string) string {
		r := httptest.NewRequest(method, target, nil)
		r.Header.Set("X-Ignored", method+target) // headers are not part of it
		return string(DefaultFingerprint(r, []byte(body)))
	}
	base := fp(http.MethodPost, "/orders?x=1", "body")
	require.Len(t, base, 32)
	require.Equal(t, base, fp(http.MethodPost, "/orders?x=1", "body"))
	require.Equal(t, base, fp(http.MethodPost, "http://other.example/orders?x=1", "body"), "the host is not part of it")

	// Each differs from the base, or from the one before it, in one part;
	// moving bytes from one part to the next changes the fingerprint too.
	seen := map[string]string{base: "POST /orders?x=1 body"}
	for _, r := range [][3]string{
		{http.MethodPatch, "/orders?x=1", "body"},
		{http.MethodPost, "/orders/?x=1", "body"},
		{http.MethodPost, "/orders?x=2", "body"},
		{http.MethodPost, "/orders", "body"},
		{http.MethodPost, "/orders?x=1", "Body"},
		{http.MethodPost, "/orders", "x=1body"},
		{http.MethodPost, "/orders", ""},
		{http.MethodPost, "/?orders", ""},
		{http.MethodPost, "/a%2Fb", ""},
		{http.MethodPost, "/a/b", ""},
	} {
		f := fp(r[0], r[1], r[2])
		name := strings.Join(r[:], " ")
		prev, dup := seen[f]
		require.False(t, dup, "%q has the fingerprint of %q", name, prev)
		seen[f] = name
	}
}

func TestRecordable(t *testing.T) {
	t.Parallel()

	for _, s := range []int{200, 201, 204, 301, 304, 400, 401, 403, 404, 410, 412, 422} {
		require.True(t, recordable(s), "%d", s)
	}
	for _, s := range []int{408, 409, 429, 500, 502, 503, 504} {
		require.False(t, recordable(s), "%d", s)
	}
}

func TestRecorderStatus(t *testing.T) {
	t.Parallel()

	rec := newRecorder(1<<10, httptest.NewRecorder())
	rec.WriteHeader(http.StatusEarlyHints) // informational: not the answer
	rec.WriteHeader(http.StatusCreated)
	rec.WriteHeader(http.StatusInternalServerError) // superfluous: ignored
	require.Equal(t, http.StatusCreated, rec.response(nil).Status)

	rec = newRecorder(1<<10, httptest.NewRecorder())
	_, err := rec.Write([]byte("implicit"))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, rec.response(nil).Status)

	rec = newRecorder(1<<10, httptest.NewRecorder())
	resp := rec.response(nil)
	require.Equal(t, http.StatusOK, resp.Status, "a handler that writes nothing answers 200")
	require.Empty(t, resp.Body)
}

// A recordable response is capped at the limit; one that will not be
// recorded (a 5xx, or after a failed statement) is not.
func TestRecorderLimit(t *testing.T) {
	t.Parallel()

	rec := newRecorder(4, httptest.NewRecorder())
	n, err := rec.Write([]byte("1234"))
	require.NoError(t, err)
	require.Equal(t, 4, n)
	_, err = rec.Write([]byte("5"))
	require.ErrorIs(t, err, errTooLarge)
	require.True(t, rec.tooLarge)

	rec = newRecorder(4, httptest.NewRecorder())
	rec.WriteHeader(http.StatusServiceUnavailable)
	_, err = rec.Write([]byte("a long explanation"))
	require.NoError(t, err)
	require.False(t, rec.tooLarge)

	rec = newRecorder(4, httptest.NewRecorder())
	rec.aborted = func() bool { return true }
	_, err = rec.Write([]byte("a long rejection"))
	require.NoError(t, err)
	require.Equal(t, "a long rejection", string(rec.response(nil).Body))
}

// The recorded response keeps the allowed headers and Content-Encoding, as
// copies.
func TestRecorderResponseHeaders(t *testing.T) {
	t.Parallel()

	rec := newRecorder(1<<10, httptest.NewRecorder())
	rec.Header().Set("Content-Type", "application/json")
	rec.Header().Add("Link", "<a>")
	rec.Header().Add("Link", "<b>")
	rec.Header().Set("Content-Encoding", "gzip")
	rec.Header().Set("Set-Cookie", "session=secret")
	rec.WriteHeader(http.StatusCreated)
	_, _ = rec.Write([]byte("{}"))

	resp := rec.response([]string{"Content-Type", "Link", "Location"})
	require.Equal(t, map[string][]string{
		"Content-Type":     {"application/json"},
		"Link":             {"<a>", "<b>"},
		"Content-Encoding": {"gzip"},
	}, resp.Header)
	rec.Header()["Link"][0] = "<changed>"
	require.Equal(t, "<a>", resp.Header["Link"][0])
	require.Equal(t, "{}", string(resp.Body))
}

// The recorder flushes nothing and cannot be hijacked: the response goes out
// after the commit.
func TestRecorderResponseController(t *testing.T) {
	t.Parallel()

	w := httptest.NewRecorder()
	rec := newRecorder(1<<10, w)
	rc := http.NewResponseController(rec)
	require.NoError(t, rc.Flush())
	require.False(t, w.Flushed)
	_, _, err := rc.Hijack()
	require.ErrorIs(t, err, http.ErrNotSupported)
}
