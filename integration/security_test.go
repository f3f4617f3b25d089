package integration_test

// The security properties of docs/threat-model.md, each tested against
// PostgreSQL: scope isolation under crafted strings, SQL injection through
// names and values, the cap on what a record stores, SHA-256 fingerprints,
// unguessable tokens, and keys kept out of error messages and responses.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/bits"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/integration/internal/pgtest"
	"github.com/idemkit/idem/internal/ident"
	"github.com/idemkit/idem/migrations"
)

// lookalikes are pairs of keys that a careless implementation could merge:
// by concatenating scope and ID, by normalising Unicode, by folding case or
// by trimming. Each pair must name two records.
var lookalikes = []struct {
	name string
	a, b idem.Key
}{
	{"colon separator", idem.Key{Scope: "a", ID: "b:c"}, idem.Key{Scope: "a:b", ID: "c"}},
	{"slash separator", idem.Key{Scope: "a/b", ID: "c"}, idem.Key{Scope: "a", ID: "b/c"}},
	{"concatenation", idem.Key{Scope: "ab", ID: "c"}, idem.Key{Scope: "a", ID: "bc"}},
	{"backslash", idem.Key{Scope: `a\`, ID: "b"}, idem.Key{Scope: "a", ID: `\b`}},
	{"LIKE wildcards", idem.Key{Scope: "user_1", ID: "k%"}, idem.Key{Scope: "userX1", ID: "kz"}},
	{"NFC vs NFD ID", idem.Key{Scope: "t", ID: "caf\u00e9"}, idem.Key{Scope: "t", ID: "cafe\u0301"}},
	{"NFC vs NFD scope", idem.Key{Scope: "ren\u00e9", ID: "k"}, idem.Key{Scope: "rene\u0301", ID: "k"}},
	{"fullwidth", idem.Key{Scope: "t", ID: "\uff21"}, idem.Key{Scope: "t", ID: "A"}},
	{"sharp s", idem.Key{Scope: "stra\u00dfe", ID: "k"}, idem.Key{Scope: "strasse", ID: "k"}},
	{"ligature", idem.Key{Scope: "t", ID: "\ufb01le"}, idem.Key{Scope: "t", ID: "file"}},
	{"Kelvin sign", idem.Key{Scope: "t", ID: "\u212a"}, idem.Key{Scope: "t", ID: "K"}},
	{"trailing space ID", idem.Key{Scope: "t", ID: "key "}, idem.Key{Scope: "t", ID: "key"}},
	{"leading space ID", idem.Key{Scope: "t", ID: " lead"}, idem.Key{Scope: "t", ID: "lead"}},
	{"trailing space scope", idem.Key{Scope: "user:1 ", ID: "k"}, idem.Key{Scope: "user:1", ID: "k"}},
	{"case", idem.Key{Scope: "t", ID: "Case"}, idem.Key{Scope: "t", ID: "case"}},
	{"case scope", idem.Key{Scope: "Alice", ID: "k"}, idem.Key{Scope: "alice", ID: "k"}},
	{"Cyrillic a", idem.Key{Scope: "t", ID: "p\u0430y"}, idem.Key{Scope: "t", ID: "pay"}},
	{"Cyrillic scope", idem.Key{Scope: "\u0430dmin", ID: "k"}, idem.Key{Scope: "admin", ID: "k"}},
	{"dotless i", idem.Key{Scope: "t", ID: "\u0131d"}, idem.Key{Scope: "t", ID: "id"}},
}

// rejectedParts are scope or ID values that Validate refuses before any SQL:
// separators a log or a concatenation could hide, and invisible characters
// that make two keys look alike.
var rejectedParts = map[string]string{
	"unit separator":   "a\x1fb",
	"NUL":              "a\x00b",
	"newline":          "a\nb",
	"zero-width space": "a\u200bb",
	"right-to-left":    "a\u202eb",
	"byte order mark":  "\ufeffab",
	"invalid UTF-8":    "a\xffb",
	"256 bytes":        strings.Repeat("k", 256),
	"empty":            "",
}

// pk is a record's primary key.
type pk struct{ scope, key string }

func pkOf(k idem.Key) pk { return pk{k.Scope, k.ID} }

// recordedKeys returns every (scope, key) of the record table.
func recordedKeys(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema) map[pk]bool {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT scope, key FROM `+s.Records)
	require.NoError(t, err)
	keys := map[pk]bool{}
	for rows.Next() {
		var k pk
		require.NoError(t, rows.Scan(&k.scope, &k.key))
		keys[k] = true
	}
	require.NoError(t, rows.Err())
	return keys
}

func TestSecurityScopeIsolationCraftedStrings(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	all := map[pk]bool{}
	for _, p := range lookalikes {
		all[pkOf(p.a)], all[pkOf(p.b)] = true, true
	}
	require.Len(t, all, 2*len(lookalikes), "every key of the table is distinct")
	want := map[pk]bool{}
	for _, p := range lookalikes {
		// The first key runs through Do, the second through WithIdempotency:
		// the second must run, not replay the first.
		ra, err := idem.Do(ctx, pool, p.a, c.fn(p.a), s.Opt)
		require.NoError(t, err, p.name)
		require.False(t, ra.Replayed, p.name)
		var rb idem.Result[string]
		require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) (err error) {
			rb, err = idem.WithIdempotency(ctx, tx, p.b, c.fn(p.b), s.Opt)
			return err
		}), p.name)
		require.False(t, rb.Replayed, "%s: %+q replayed %+q's record", p.name, p.b, p.a)
		require.NotEqual(t, ra.Value, rb.Value, p.name)

		// Each key replays its own result, never the other's, whichever
		// entry point asks.
		again, err := idem.Do(ctx, pool, p.b, c.fn(p.b), s.Opt)
		require.NoError(t, err, p.name)
		require.True(t, again.Replayed, p.name)
		require.Equal(t, rb.Value, again.Value, p.name)
		require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
			again, err := idem.WithIdempotency(ctx, tx, p.a, c.fn(p.a), s.Opt)
			require.True(t, again.Replayed, p.name)
			require.Equal(t, ra.Value, again.Value, p.name)
			return err
		}), p.name)
		require.Equal(t, 1, s.CountEffects(t, pool, p.a), p.name)
		require.Equal(t, 1, s.CountEffects(t, pool, p.b), p.name)
		want[pkOf(p.a)], want[pkOf(p.b)] = true, true
	}
	require.EqualValues(t, 2*len(lookalikes), c.runs.Load(), "every key ran exactly once")
	// The record table holds the keys byte for byte, one row each.
	require.Equal(t, want, recordedKeys(t, pool, s))

	// Control, format and invalid characters never reach the database.
	for name, bad := range rejectedParts {
		for _, k := range []idem.Key{{Scope: bad, ID: "k"}, {Scope: "t", ID: bad}} {
			_, err := idem.Do(ctx, pool, k, c.fn(k), s.Opt)
			require.ErrorIs(t, err, idem.ErrInvalidKey, name)
			require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
				_, err := idem.WithIdempotency(ctx, tx, k, c.fn(k), s.Opt)
				require.ErrorIs(t, err, idem.ErrInvalidKey, name)
				return nil
			}))
			_, _, err = idem.Claim[string](ctx, pool, k, time.Minute, s.Opt)
			require.ErrorIs(t, err, idem.ErrInvalidKey, name)
		}
		_, err := idem.IssueToken(ctx, pool, bad, time.Minute, s.Opt)
		require.ErrorIs(t, err, idem.ErrInvalidKey, name)
	}
	require.EqualValues(t, 2*len(lookalikes), c.runs.Load(), "fn never ran for a rejected key")
	require.Equal(t, want, recordedKeys(t, pool, s), "nothing recorded for rejected keys")
}

// scopeServer answers with a value unique to each execution and writes one
// effect under the request's scope (the X-Scope header, percent-encoded so
// that any string survives the trip) and key.
type scopeServer struct {
	s    *pgtest.Schema
	runs atomic.Int64
}

func (h *scopeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	scope, _ := url.PathUnescape(r.Header.Get("X-Scope"))
	key, _ := idemhttp.ParseKey(r.Header)
	value := fmt.Sprintf("run-%d-%d", h.runs.Add(1), time.Now().UnixNano())
	if err := h.s.AddEffect(r.Context(), idemhttp.Tx(r.Context()), idem.Key{Scope: scope, ID: key}, value); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, value)
}

func scopeFromHeader(r *http.Request) (string, error) {
	return url.PathUnescape(r.Header.Get("X-Scope"))
}

func TestSecurityHTTPScopeIsolationCraftedStrings(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := &scopeServer{s: s}
	mw, err := idemhttp.Middleware(pool, idemhttp.Config{Scope: scopeFromHeader, Options: []idem.DoOption{s.Opt}})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	send := func(k idem.Key) httpReply {
		return post(t, srv.URL, "", idemhttp.FormatKey(k.ID), "same body", "X-Scope", url.PathEscape(k.Scope))
	}

	runs := int64(0)
	for _, p := range lookalikes {
		if strings.ContainsFunc(p.a.ID+p.b.ID, func(r rune) bool { return r > 0x7e }) {
			continue // the header carries printable ASCII keys only; scopes are free
		}
		ra, rb := send(p.a), send(p.b)
		require.Equal(t, http.StatusCreated, ra.status, p.name)
		require.Equal(t, http.StatusCreated, rb.status, "%s: %s", p.name, rb.body)
		require.Empty(t, rb.header.Get(idemhttp.ReplayedHeader), "%s: another scope's key replayed", p.name)
		require.NotEqual(t, ra.body, rb.body, p.name)
		runs += 2
		// Each replays its own response.
		for _, k := range []struct {
			key   idem.Key
			first httpReply
		}{{p.a, ra}, {p.b, rb}} {
			again := send(k.key)
			require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader), p.name)
			require.Equal(t, k.first.body, again.body, p.name)
			require.Equal(t, 1, s.CountEffects(t, pool, k.key), p.name)
		}
	}
	require.Greater(t, runs, int64(20), "most pairs went through HTTP")
	require.Equal(t, runs, h.runs.Load())

	// A scope function that returns an unusable scope (a control character)
	// is the server's fault: 500, and the handler does not run.
	r := post(t, srv.URL, "", `"k"`, "x", "X-Scope", url.PathEscape("tenant\x1fuser"))
	require.Equal(t, http.StatusInternalServerError, r.status)
	require.Contains(t, r.body, "scope-invalid")
	require.Equal(t, runs, h.runs.Load())
}

// tokenTag computes the scope tag IssueToken appends (token.go's scopeTag):
// an unkeyed hash anyone can compute. A token's tag starts with it, followed
// by a check of the random part and the scope tag; a token issued before the
// check carries it alone.
func tokenTag(scope string) string {
	h := sha256.Sum256([]byte("idem token scope\x00" + scope))
	return base64.RawURLEncoding.EncodeToString(h[:6])
}

func TestSecurityTokensAreScoped(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	req := idem.RequireIssued()

	token, err := idem.IssueToken(ctx, pool, "tenant-a", time.Hour, s.Opt)
	require.NoError(t, err)
	random, tag, ok := strings.Cut(token, ".")
	require.True(t, ok)
	require.Equal(t, tokenTag("tenant-a"), tag[:len(tokenTag("tenant-a"))], "the tag starts with the documented unkeyed hash")

	own := idem.Key{Scope: "tenant-a", ID: token}
	first, err := idem.Do(ctx, pool, own, c.fn(own), s.Opt, req)
	require.NoError(t, err)
	require.False(t, first.Replayed)

	for _, scope := range []string{"tenant-b", "tenant-a ", "Tenant-a", "tenant-\u0430", "tenant", "tenant-a:x"} {
		other := idem.Key{Scope: scope, ID: token}
		_, err := idem.Do(ctx, pool, other, c.fn(other), s.Opt, req)
		require.ErrorIs(t, err, idem.ErrTokenOtherScope, scope)
		_, _, err = idem.Claim[string](ctx, pool, other, time.Minute, s.Opt, req)
		require.ErrorIs(t, err, idem.ErrTokenOtherScope, scope)

		// The tag is no secret: recomputing it for the other scope gets past
		// the shape check, but no record was issued there.
		forged := idem.Key{Scope: scope, ID: random + "." + tokenTag(scope)}
		_, err = idem.Do(ctx, pool, forged, c.fn(forged), s.Opt, req)
		require.ErrorIs(t, err, idem.ErrTokenUnknown, scope)
		_, _, err = idem.Claim[string](ctx, pool, forged, time.Minute, s.Opt, req)
		require.ErrorIs(t, err, idem.ErrTokenUnknown, scope)
		require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
			_, err := idem.WithIdempotency(ctx, tx, forged, c.fn(forged), s.Opt, req)
			require.ErrorIs(t, err, idem.ErrTokenUnknown, scope)
			return nil
		}))
	}
	require.EqualValues(t, 1, c.runs.Load(), "no other scope ran or replayed with the token")

	// Without RequireIssued the token is just a string: in another scope it
	// names another record and runs, never replaying tenant-a's result.
	other := idem.Key{Scope: "tenant-b", ID: token}
	res, err := idem.Do(ctx, pool, other, c.fn(other), s.Opt)
	require.NoError(t, err)
	require.False(t, res.Replayed)
	require.NotEqual(t, first.Value, res.Value)
	again, err := idem.Do(ctx, pool, own, c.fn(own), s.Opt, req)
	require.NoError(t, err)
	require.True(t, again.Replayed)
	require.Equal(t, first.Value, again.Value)
}

var tokenRE = regexp.MustCompile(`^[A-Za-z0-9_-]{43}\.[A-Za-z0-9_-]{12}$`)

func TestSecurityTokensAreUnguessable(t *testing.T) {
	pool := pgtest.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 })
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	const n = 10_000
	tokens := make([]string, n)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
				tok, err := idem.IssueToken(ctx, pool, "user:1", time.Hour, s.Opt)
				if err != nil {
					t.Error(err)
					return
				}
				tokens[i] = tok
			}
		})
	}
	wg.Wait()
	require.False(t, t.Failed())

	seen := make(map[string]bool, n)
	ones := 0
	var perBit [256]int
	for _, tok := range tokens {
		require.Regexp(t, tokenRE, tok)
		require.Len(t, tok, 56)
		require.False(t, seen[tok], "token issued twice")
		seen[tok] = true
		random, tag, _ := strings.Cut(tok, ".")
		require.Equal(t, tokenTag("user:1"), tag[:len(tokenTag("user:1"))])
		b, err := base64.RawURLEncoding.DecodeString(random)
		require.NoError(t, err)
		require.Len(t, b, 32, "256 random bits")
		for i, x := range b {
			ones += bits.OnesCount8(x)
			for j := range 8 {
				perBit[i*8+j] += int(x>>j) & 1
			}
		}
	}
	// A fair source sets half the bits: over 2.56M bits the share is 0.5
	// within 0.0003 (one standard deviation); 0.005 is 16 deviations. Each of
	// the 256 positions is set in 50% ± 0.5% of tokens; 3% is 6 deviations,
	// which catches a stuck bit.
	share := float64(ones) / float64(n*256)
	require.InDelta(t, 0.5, share, 0.005, "share of one bits")
	for i, k := range perBit {
		require.InDelta(t, 0.5, float64(k)/n, 0.03, "bit %d", i)
	}
	var issued int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+s.Records+` WHERE status = 'issued'`).Scan(&issued))
	require.Equal(t, n, issued)

	// One character changed anywhere, in the random part or the tag: the
	// check no longer matches, so the token is unknown, and fn never runs.
	c := &counter{s: s}
	token := tokens[0]
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range len(token) {
		if token[i] == '.' {
			continue
		}
		b := []byte(token)
		b[i] = alphabet[(strings.IndexByte(alphabet, b[i])+1+i)%len(alphabet)]
		require.NotEqual(t, token, string(b))
		k := idem.Key{Scope: "user:1", ID: string(b)}
		_, err := idem.Do(ctx, pool, k, c.fn(k), s.Opt, idem.RequireIssued())
		require.ErrorIs(t, err, idem.ErrTokenRejected, "position %d", i)
		require.ErrorIs(t, err, idem.ErrTokenUnknown, "position %d", i)
	}
	require.Zero(t, c.runs.Load())
	k := idem.Key{Scope: "user:1", ID: token}
	res, err := idem.Do(ctx, pool, k, c.fn(k), s.Opt, idem.RequireIssued())
	require.NoError(t, err)
	require.False(t, res.Replayed, "the genuine token still works")
	require.EqualValues(t, 1, c.runs.Load())
}

// hostileNames are table, schema and column names that would change a
// statement if pasted into it. Each gets a canary table as its target.
func hostileNames(canary string) []string {
	return []string{
		`x; DROP TABLE ` + canary + `; --`,
		`x"; DROP TABLE ` + canary + `; --`,
		`"x"`,
		`x"y`,
		`x'y`,
		`x\y`,
		"x\x00y",
		`x y`,
		`x.y`,
		`x-y`,
		`x/*`,
		`x$1`,
		"caf\u00e9",
		`1x`,
		``,
		strings.Repeat("a", 64),
	}
}

// canaryAlive reports whether the canary table still exists with its row.
func canaryAlive(t *testing.T, pool *pgxpool.Pool, canary string) bool {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM `+canary).Scan(&n); err != nil {
		t.Logf("canary: %v", err)
		return false
	}
	return n == 1
}

func newCanary(t *testing.T, pool *pgxpool.Pool, s *pgtest.Schema) string {
	t.Helper()
	canary := pgx.Identifier{s.Name, "canary"}.Sanitize()
	_, err := pool.Exec(context.Background(), `CREATE TABLE `+canary+` (x int); INSERT INTO `+canary+` VALUES (1)`)
	require.NoError(t, err)
	require.True(t, canaryAlive(t, pool, canary))
	return canary
}

// relations lists the schema's tables and indexes.
func relations(t *testing.T, pool *pgxpool.Pool, schema string) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 ORDER BY 1`, schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return names
}

func TestSecuritySQLInjectionThroughNames(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	canary := newCanary(t, pool, s)
	c := &counter{s: s}
	ctx := context.Background()
	before := relations(t, pool, s.Name)
	key := idem.Key{Scope: "t", ID: "k"}
	smOK := idem.StateMachineConfig{Schema: s.Name, Table: "orders", IDColumn: "id", StateColumn: "state",
		States: []string{"NEW", "DONE"}, Transitions: map[string][]string{"NEW": {"DONE"}}}

	// tableErr is what a call naming the table gets: an invalid name fails
	// with ErrInvalidOption before any SQL.
	tableErr := func(schema, table string) error {
		_, err := idem.Lookup(ctx, pool, "t", "k", idem.WithTable(schema, table))
		return err
	}
	for _, h := range hostileNames(canary) {
		require.Error(t, ident.ValidateTable("", h), "%q", h)
		require.ErrorIs(t, tableErr("", h), idem.ErrInvalidOption, "%q", h)
		require.ErrorIs(t, tableErr(s.Name, h), idem.ErrInvalidOption, "%q", h)
		if h != "" { // an empty schema means the search_path
			require.Error(t, ident.ValidateTable(h, "t"), "%q", h)
			require.ErrorIs(t, tableErr(h, "t"), idem.ErrInvalidOption, "%q", h)
		}
		opts := []idem.TableOption{idem.WithTable(s.Name, h), idem.WithInboxTable(s.Name, h)}
		if h != "" { // an empty schema is valid: the search_path
			opts = append(opts, idem.WithTable(h, "t"), idem.WithInboxTable(h, "t"))
		}
		for _, opt := range opts {
			_, err := idem.Do(ctx, pool, key, c.fn(key), opt)
			require.ErrorIs(t, err, idem.ErrInvalidOption, "%q", h)
			require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
				_, err := idem.WithIdempotency(ctx, tx, key, c.fn(key), opt)
				require.ErrorIs(t, err, idem.ErrInvalidOption, "%q", h)
				_, err = idem.ConsumeOnce(ctx, tx, "c", "m", func(context.Context, pgx.Tx) error { return nil }, opt)
				require.ErrorIs(t, err, idem.ErrInvalidOption, "%q", h)
				return nil
			}))
			_, _, err = idem.Claim[string](ctx, pool, key, time.Minute, opt)
			require.ErrorIs(t, err, idem.ErrInvalidOption, "%q", h)
			_, err = idem.IssueToken(ctx, pool, "t", time.Minute, opt)
			require.ErrorIs(t, err, idem.ErrInvalidOption, "%q", h)
			_, err = idem.Purge(ctx, pool, idem.PurgeParams{}, opt)
			require.ErrorIs(t, err, idem.ErrInvalidOption, "%q", h)
			_, err = idem.Purge(ctx, pool, idem.PurgeParams{InboxRetention: time.Hour}, opt)
			require.ErrorIs(t, err, idem.ErrInvalidOption, "%q", h)
		}

		// Every identifier of a state machine.
		for field, set := range map[string]func(*idem.StateMachineConfig){
			"Schema":        func(c *idem.StateMachineConfig) { c.Schema = h },
			"Table":         func(c *idem.StateMachineConfig) { c.Table = h },
			"IDColumn":      func(c *idem.StateMachineConfig) { c.IDColumn = h },
			"StateColumn":   func(c *idem.StateMachineConfig) { c.StateColumn = h },
			"VersionColumn": func(c *idem.StateMachineConfig) { c.VersionColumn = h },
			"HistoryTable":  func(c *idem.StateMachineConfig) { c.HistoryTable = h },
		} {
			if h == "" && (field == "Schema" || field == "VersionColumn" || field == "HistoryTable") {
				continue // empty means none
			}
			cfg := smOK
			set(&cfg)
			_, err := idem.NewStateMachine(cfg)
			require.ErrorIs(t, err, idem.ErrInvalidOption, "%s %q", field, h)
		}
		m, err := idem.NewStateMachine(smOK)
		require.NoError(t, err)
		_, err = m.Transition(ctx, pool, 1, "DONE", idem.Set(h, 1))
		require.ErrorIs(t, err, idem.ErrInvalidOption, "Set %q", h)

		// The migrations.
		mopts := []migrations.Option{migrations.WithTable(s.Name, h), migrations.WithVersionTable(h)}
		if h != "" {
			mopts = append(mopts, migrations.WithTable(h, "t"))
		}
		for _, opt := range mopts {
			require.ErrorIs(t, migrations.Up(ctx, pool, opt), idem.ErrInvalidOption, "%q", h)
			require.ErrorIs(t, migrations.Down(ctx, pool, opt), idem.ErrInvalidOption, "%q", h)
		}
	}
	require.Zero(t, c.runs.Load())
	require.True(t, canaryAlive(t, pool, canary))
	require.Equal(t, before, relations(t, pool, s.Name), "no table was created or dropped")

	// The limits: a 48-byte table and a 63-byte schema pass, one more fails.
	// The valid names reach the database, which has no such table.
	require.NoError(t, ident.ValidateTable(strings.Repeat("s", 63), strings.Repeat("t", 48)))
	err := tableErr(strings.Repeat("s", 63), strings.Repeat("t", 48))
	require.Error(t, err)
	require.NotErrorIs(t, err, idem.ErrInvalidOption)
	require.ErrorIs(t, tableErr("", strings.Repeat("t", 49)), idem.ErrInvalidOption)
	require.ErrorIs(t, tableErr(strings.Repeat("s", 64), "t"), idem.ErrInvalidOption)
}

// migrations.Files does not validate (its callers do), but it still quotes:
// its SQL run with hostile names creates tables with those literal names.
func TestSecurityMigrationFilesQuoteNames(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	canary := newCanary(t, pool, s)
	ctx := context.Background()
	hostileTable := `t"; DROP TABLE ` + canary + `; --`
	hostileSchema := `s"; DROP TABLE ` + canary + `; --'\`
	_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{hostileSchema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), `DROP SCHEMA `+pgx.Identifier{hostileSchema}.Sanitize()+` CASCADE`)
	})
	for _, n := range []struct{ schema, table string }{{s.Name, hostileTable}, {hostileSchema, "keys"}, {hostileSchema, hostileTable}} {
		up, err := io.ReadAll(must(migrations.Files(n.schema, n.table).Open("000001_create_idempotent_record.up.sql")))
		require.NoError(t, err)
		_, err = pool.Exec(ctx, string(up)) // several statements: the simple protocol
		require.NoError(t, err, "%q.%q", n.schema, n.table)
		require.True(t, tableExists(t, pool, n.schema, n.table), "%q.%q", n.schema, n.table)
		require.True(t, canaryAlive(t, pool, canary))
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestSecurityValuesAreParameters(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	canary := newCanary(t, pool, s)
	c := &counter{s: s}
	ctx := context.Background()
	hostile := []string{
		`'; DROP TABLE ` + canary + `; --`,
		`' OR '1'='1`,
		`"; DROP TABLE ` + canary + `; --`,
		`\'; DROP TABLE ` + canary + `; --`,
		`$1`,
		`%`,
		`_`,
		`*/ DROP TABLE ` + canary + ` /*`,
		`E'\x00'`,
		`$$; DROP TABLE ` + canary + `; $$`,
	}
	want := map[pk]bool{}
	for i, v := range hostile {
		for _, k := range []idem.Key{{Scope: "t", ID: v}, {Scope: v, ID: fmt.Sprint("k", i)}} {
			first, err := idem.Do(ctx, pool, k, c.fn(k), s.Opt)
			require.NoError(t, err, "%q", v)
			again, err := idem.Do(ctx, pool, k, c.fn(k), s.Opt)
			require.NoError(t, err, "%q", v)
			require.True(t, again.Replayed)
			require.Equal(t, first.Value, again.Value)
			want[pkOf(k)] = true
		}
		// Lease mode, tokens and the inbox take the same values as
		// parameters.
		lk := idem.Key{Scope: "lease", ID: v}
		l, _, err := idem.Claim[string](ctx, pool, lk, time.Minute, s.Opt)
		require.NoError(t, err, "%q", v)
		require.NoError(t, l.Checkpoint(ctx, pool, v, v))
		require.NoError(t, l.Complete(ctx, pool, v))
		want[pkOf(lk)] = true
		tok, err := idem.IssueToken(ctx, pool, v, time.Minute, s.Opt)
		require.NoError(t, err, "%q", v)
		want[pk{v, tok}] = true
		require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
			ran, err := idem.ConsumeOnce(ctx, tx, v, v, func(context.Context, pgx.Tx) error { return nil }, s.InboxOpt)
			require.True(t, ran)
			return err
		}))
	}
	require.True(t, canaryAlive(t, pool, canary))
	require.Equal(t, want, recordedKeys(t, pool, s), "every value stored byte for byte")
	var inbox int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{s.Name, idem.DefaultInboxTable}.Sanitize()+
		` WHERE consumer = message_id`).Scan(&inbox))
	require.Equal(t, len(hostile), inbox)

	// A state machine's states are values too.
	orders := pgx.Identifier{s.Name, "orders"}.Sanitize()
	_, err := pool.Exec(ctx, `CREATE TABLE `+orders+` (id text PRIMARY KEY, state text NOT NULL, note text)`)
	require.NoError(t, err)
	m, err := idem.NewStateMachine(idem.StateMachineConfig{Schema: s.Name, Table: "orders", IDColumn: "id", StateColumn: "state",
		States: append([]string{"NEW"}, hostile...), Transitions: map[string][]string{"NEW": hostile}})
	require.NoError(t, err)
	for _, v := range hostile {
		_, err := pool.Exec(ctx, `INSERT INTO `+orders+` VALUES ($1, 'NEW')`, v)
		require.NoError(t, err)
		res, err := m.Transition(ctx, pool, v, v, idem.Set("note", v))
		require.NoError(t, err, "%q", v)
		require.True(t, res.Applied)
		var state, note string
		require.NoError(t, pool.QueryRow(ctx, `SELECT state, note FROM `+orders+` WHERE id = $1`, v).Scan(&state, &note))
		require.Equal(t, v, state)
		require.Equal(t, v, note)
	}
	require.True(t, canaryAlive(t, pool, canary))
}

func TestSecurityResultSizeCap(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	ctx := context.Background()
	blob := func(k idem.Key, n int, runs *atomic.Int64) func(context.Context, pgx.Tx) ([]byte, error) {
		return func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
			runs.Add(1)
			return bytes.Repeat([]byte("x"), n), s.AddEffect(ctx, tx, k, "blob")
		}
	}

	_, err := idem.Do(ctx, pool, idem.Key{Scope: "t", ID: "neg"}, blob(idem.Key{}, 1, new(atomic.Int64)), s.Opt, idem.WithMaxResultSize(-1))
	require.ErrorIs(t, err, idem.ErrInvalidOption)

	// The default is 1 MiB: exactly that is recorded, one byte more is not.
	var runs atomic.Int64
	at := idem.Key{Scope: "t", ID: "at-cap"}
	res, err := idem.Do(ctx, pool, at, blob(at, idem.DefaultMaxResultSize, &runs), s.Opt)
	require.NoError(t, err)
	require.Len(t, res.Value, 1<<20)
	require.Len(t, s.ReadRecord(t, pool, at).Response, 1<<20)
	over := idem.Key{Scope: "t", ID: "over-cap"}
	for _, opt := range []idem.Option{nil, idem.WithMaxResultSize(0)} {
		_, err = idem.Do(ctx, pool, over, blob(over, idem.DefaultMaxResultSize+1, &runs), s.Opt, opt)
		require.ErrorIs(t, err, idem.ErrResultTooLarge)
		require.Nil(t, s.ReadRecord(t, pool, over), "nothing recorded")
		require.Zero(t, s.CountEffects(t, pool, over), "fn's writes rolled back")
	}
	res, err = idem.Do(ctx, pool, over, blob(over, 10, &runs), s.Opt)
	require.NoError(t, err, "a retry runs fn again")
	require.False(t, res.Replayed)
	require.EqualValues(t, 4, runs.Load())
	require.Equal(t, 1, s.CountEffects(t, pool, over))

	// The cap applies to the encoding: a 99-character string is 101 bytes of
	// JSON. Inside the caller's transaction the failure is rolled back like
	// an error from fn: the savepoint is gone and the transaction usable.
	small := idem.WithMaxResultSize(100)
	k := idem.Key{Scope: "t", ID: "in-tx"}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx) //nolint:errcheck
	_, err = idem.WithIdempotency(ctx, tx, k, func(ctx context.Context, tx pgx.Tx) (string, error) {
		return strings.Repeat("y", 99), s.AddEffect(ctx, tx, k, "doomed")
	}, s.Opt, small)
	require.ErrorIs(t, err, idem.ErrResultTooLarge)
	require.Contains(t, err.Error(), "101 bytes")
	require.False(t, savepointExists(t, tx, "idem_fn"))
	require.NoError(t, s.AddEffect(ctx, tx, idem.Key{Scope: "t", ID: "caller"}, "kept"))
	ok, err := idem.WithIdempotency(ctx, tx, k, func(ctx context.Context, tx pgx.Tx) (string, error) {
		return strings.Repeat("y", 98), s.AddEffect(ctx, tx, k, "fits")
	}, s.Opt, small)
	require.NoError(t, err)
	require.False(t, ok.Replayed)
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, s.CountEffects(t, pool, k), "only the run that fit")
	require.Equal(t, 1, s.CountEffects(t, pool, idem.Key{Scope: "t", ID: "caller"}))
	require.Len(t, s.ReadRecord(t, pool, k).Response, 100)

	// Lease mode: an oversized result or checkpoint is refused and the lease
	// is still held.
	lk := idem.Key{Scope: "t", ID: "lease"}
	l, _, err := idem.Claim[[]byte](ctx, pool, lk, time.Minute, s.Opt, small)
	require.NoError(t, err)
	require.ErrorIs(t, l.Checkpoint(ctx, pool, "p", bytes.Repeat([]byte("z"), 101)), idem.ErrResultTooLarge)
	require.ErrorIs(t, l.Complete(ctx, pool, bytes.Repeat([]byte("z"), 101)), idem.ErrResultTooLarge)
	require.Equal(t, idem.StatusProcessing, s.ReadRecord(t, pool, lk).Status)
	require.NoError(t, l.Extend(ctx, pool))
	require.NoError(t, l.Complete(ctx, pool, []byte("done")))

	// A permanent failure's message is stored cut to the cap, at a UTF-8
	// boundary; the first caller still gets the whole error.
	for _, useTx := range []bool{false, true} {
		pk := idem.Key{Scope: "t", ID: fmt.Sprint("permanent-", useTx)}
		msg := strings.Repeat("\u00e9", 10) // 20 bytes
		fail := func(context.Context, pgx.Tx) (string, error) { return "", idem.Permanent(errors.New(msg)) }
		if useTx {
			require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
				_, err := idem.WithIdempotency(ctx, tx, pk, fail, s.Opt, idem.WithMaxResultSize(5))
				require.Equal(t, msg, err.Error())
				return nil
			}))
		} else {
			_, err := idem.Do(ctx, pool, pk, fail, s.Opt, idem.WithMaxResultSize(5))
			require.Equal(t, msg, err.Error())
		}
		require.Equal(t, "\u00e9\u00e9", string(s.ReadRecord(t, pool, pk).Response))
		res, err := idem.Do(ctx, pool, pk, fail, s.Opt)
		require.True(t, res.Replayed)
		require.True(t, idem.IsPermanent(err))
		require.Equal(t, "\u00e9\u00e9", err.Error())
	}
}

// The middleware's body cap is tested by TestHTTPResponseOverTheCap
// (http_test.go). This tests the whole recorded response: a body of exactly
// MaxResponseBody (1 MiB) is recorded with its headers, although the record
// is then over idem's default 1 MiB cap, and headers that push the record
// past MaxResponseBody + 64 KiB are refused like a large body.
func TestSecurityHTTPRecordedResponseCap(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	var runs atomic.Int64
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		key := idem.Key{Scope: "ivan", ID: r.URL.Path}
		if err := s.AddEffect(r.Context(), idemhttp.Tx(r.Context()), key, "x"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.URL.Path == "/big-header" {
			w.Header().Set("Location", "/"+strings.Repeat("h", 70<<10))
		} else {
			w.Header().Set("Location", "/full")
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(bytes.Repeat([]byte("b"), 1<<20))
	})
	mw, err := idemhttp.Middleware(pool, idemhttp.Config{Scope: func(*http.Request) (string, error) { return "ivan", nil },
		Options: []idem.DoOption{s.Opt}})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)

	full := post(t, srv.URL+"/full", "", `"full"`, "")
	require.Equal(t, http.StatusCreated, full.status)
	require.Len(t, full.body, 1<<20)
	again := post(t, srv.URL+"/full", "", `"full"`, "")
	require.Equal(t, "true", again.header.Get(idemhttp.ReplayedHeader))
	require.Equal(t, full.body, again.body)

	big := post(t, srv.URL+"/big-header", "", `"big"`, "")
	require.Equal(t, http.StatusInternalServerError, big.status)
	require.Contains(t, big.body, "response-too-large")
	require.Nil(t, s.ReadRecord(t, pool, idem.Key{Scope: "ivan", ID: "big"}))
	require.Zero(t, s.CountEffects(t, pool, idem.Key{Scope: "ivan", ID: "/big-header"}))
	require.EqualValues(t, 2, runs.Load())
}

func TestSecurityDefaultFingerprintIsSHA256(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	h := &signupServer{s: s}
	mw, err := idemhttp.Middleware(pool, idemhttp.Config{Scope: func(*http.Request) (string, error) { return "judy", nil },
		Options: []idem.DoOption{s.Opt}})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(h))
	t.Cleanup(srv.Close)
	ctx := context.Background()

	r := post(t, srv.URL+"/orders/a%2Fb?q=1&z=%20", "", `"fp"`, "hello")
	require.Equal(t, http.StatusCreated, r.status)
	var stored []byte
	require.NoError(t, pool.QueryRow(ctx, `SELECT fingerprint FROM `+s.Records+` WHERE scope = 'judy' AND key = 'fp'`).Scan(&stored))
	want := sha256.Sum256([]byte("POST\x00/orders/a%2Fb\x00q=1&z=%20\x00hello"))
	require.Len(t, stored, sha256.Size)
	require.Equal(t, want[:], stored, "SHA-256 over method, escaped path, raw query (NUL-terminated) and body")
	req := httptest.NewRequest(http.MethodPost, "/orders/a%2Fb?q=1&z=%20", nil)
	require.Equal(t, want[:], idemhttp.DefaultFingerprint(req, []byte("hello")))

	// Requests that differ only where a looser canonical form would merge
	// them get 422 with the same key, not the first one's response: an
	// escaped slash against a real one, and a NUL moved between the path
	// (decoded from %00) and the body.
	for i, pair := range [][2][2]string{
		{{"/x/a%2Fb", "body"}, {"/x/a/b", "body"}},
		{{"/a%00b", "body"}, {"/a?b", "\x00body"}},
	} {
		key := fmt.Sprintf(`"pair-%d"`, i)
		first := post(t, srv.URL+pair[0][0], "", key, pair[0][1])
		require.Equal(t, http.StatusCreated, first.status, "%q: %s", pair[0], first.body)
		second := post(t, srv.URL+pair[1][0], "", key, pair[1][1])
		require.Equal(t, http.StatusUnprocessableEntity, second.status, "%q then %q: %s", pair[0], pair[1], second.body)
	}
}

// secretKey looks like a credential: it must never show in an error message,
// a response or a log line.
func secretKey(t *testing.T) string {
	b := make([]byte, 12)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return "sk_live_" + hex.EncodeToString(b)
}

// requireHidden fails when msg contains the secret or its random part.
func requireHidden(t *testing.T, secret, msg, what string) {
	t.Helper()
	require.NotContains(t, msg, secret, what)
	require.NotContains(t, msg, strings.TrimPrefix(secret, "sk_live_")[:16], what)
}

func TestSecurityKeysNotInClear(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	secret := secretKey(t)
	hidden := func(err error, what string) {
		t.Helper()
		require.Error(t, err, what)
		requireHidden(t, secret, err.Error(), what)
		requireHidden(t, secret, fmt.Sprintf("%+v", err), what)
	}

	// Invalid keys: the reason, never the key.
	for name, bad := range map[string]idem.Key{
		"control in ID":    {Scope: "t", ID: secret + "\n"},
		"NUL in ID":        {Scope: "t", ID: secret + "\x00"},
		"format in scope":  {Scope: secret + "\u200b", ID: "k"},
		"bad UTF-8 in ID":  {Scope: "t", ID: secret + "\xff"},
		"ID too long":      {Scope: "t", ID: strings.Repeat(secret, 10)},
		"scope too long":   {Scope: strings.Repeat(secret, 10), ID: "k"},
		"control in scope": {Scope: secret + "\x1f", ID: "k"},
	} {
		_, err := idem.Do(ctx, pool, bad, c.fn(bad), s.Opt)
		require.ErrorIs(t, err, idem.ErrInvalidKey, name)
		hidden(err, name)
		_, _, err = idem.Claim[string](ctx, pool, bad, time.Minute, s.Opt)
		hidden(err, name)
		require.NoError(t, inTx(t, pool, pgx.ReadCommitted, func(tx pgx.Tx) error {
			_, err := idem.WithIdempotency(ctx, tx, bad, c.fn(bad), s.Opt)
			hidden(err, name)
			_, err = idem.ConsumeOnce(ctx, tx, bad.Scope, bad.ID, func(context.Context, pgx.Tx) error { return nil }, s.InboxOpt)
			hidden(err, name)
			return nil
		}))
		_, err = idem.IssueToken(ctx, pool, bad.Scope, time.Minute, s.Opt)
		if err != nil {
			hidden(err, name)
		}
	}

	// Reused with another fingerprint.
	key := idem.Key{Scope: "t", ID: secret, Fingerprint: []byte("A")}
	_, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt)
	require.NoError(t, err)
	reused := key
	reused.Fingerprint = []byte("B")
	_, err = idem.Do(ctx, pool, reused, c.fn(reused), s.Opt)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	hidden(err, "reused")
	_, _, err = idem.Claim[string](ctx, pool, reused, time.Minute, s.Opt)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	hidden(err, "reused, lease")

	// In progress: held by an open transaction, and by a live lease.
	held := idem.Key{Scope: "t", ID: secret + "-held"}
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = idem.WithIdempotency(ctx, tx, held, c.fn(held), s.Opt)
	require.NoError(t, err)
	_, err = idem.Do(ctx, pool, held, c.fn(held), s.Opt, idem.NoWait())
	require.ErrorIs(t, err, idem.ErrInProgress)
	hidden(err, "in progress")
	require.NoError(t, tx.Rollback(ctx))
	leased := idem.Key{Scope: "t", ID: secret + "-lease"}
	w1, _, err := idem.Claim[string](ctx, pool, leased, time.Minute, s.Opt)
	require.NoError(t, err)
	_, _, err = idem.Claim[string](ctx, pool, leased, time.Minute, s.Opt)
	require.ErrorIs(t, err, idem.ErrInProgress)
	hidden(err, "lease in progress")

	// Lease lost: end w1's lease by hand (no timing), another worker takes
	// the key over.
	_, err = pool.Exec(ctx, `UPDATE `+s.Records+` SET locked_until = now() - interval '1 second' WHERE scope = $1 AND key = $2`,
		leased.Scope, leased.ID)
	require.NoError(t, err)
	w2, _, err := idem.Claim[string](ctx, pool, leased, time.Minute, s.Opt)
	require.NoError(t, err)
	for name, err := range map[string]error{
		"Extend":     w1.Extend(ctx, pool),
		"Checkpoint": w1.Checkpoint(ctx, pool, "p", nil),
		"Complete":   w1.Complete(ctx, pool, "v"),
	} {
		require.ErrorIs(t, err, idem.ErrLeaseLost, name)
		hidden(err, "lease lost: "+name)
	}
	require.NoError(t, w2.Release(ctx, pool))

	// Token errors: unknown (any shape), another scope's, expired.
	tok, err := idem.IssueToken(ctx, pool, "t", time.Hour, s.Opt)
	require.NoError(t, err)
	forged := secret + strings.Repeat("A", 43-len(secret)) + "." + tokenTag("t")
	for name, k := range map[string]idem.Key{
		"unknown":     {Scope: "t", ID: secret},
		"forged":      {Scope: "t", ID: forged},
		"other scope": {Scope: "u", ID: forged},
	} {
		_, err := idem.Do(ctx, pool, k, c.fn(k), s.Opt, idem.RequireIssued())
		require.ErrorIs(t, err, idem.ErrTokenRejected, name)
		hidden(err, "token "+name)
	}
	expireRecord(t, pool, s, idem.Key{Scope: "t", ID: tok})
	_, err = idem.Do(ctx, pool, idem.Key{Scope: secret, ID: tok}, c.fn(key), s.Opt, idem.RequireIssued())
	require.ErrorIs(t, err, idem.ErrTokenOtherScope)
	hidden(err, "token of another scope, secret scope")
	_, err = idem.Do(ctx, pool, idem.Key{Scope: "t", ID: tok}, c.fn(key), s.Opt, idem.RequireIssued())
	require.ErrorIs(t, err, idem.ErrTokenExpired)

	// Result too large.
	big := idem.Key{Scope: secret, ID: secret + "-big"}
	_, err = idem.Do(ctx, pool, big, func(context.Context, pgx.Tx) (string, error) { return strings.Repeat("x", 200), nil },
		s.Opt, idem.WithMaxResultSize(100))
	require.ErrorIs(t, err, idem.ErrResultTooLarge)
	hidden(err, "too large")

	// slog prints a Key as digests.
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("claim", "key", idem.Key{Scope: secret, ID: secret})
	requireHidden(t, secret, logs.String(), "slog")
	digest := sha256.Sum256([]byte(secret))
	require.Contains(t, logs.String(), `"id":"sha256:`+hex.EncodeToString(digest[:6])+`"`)
	require.Contains(t, logs.String(), `"scope":"sha256:`)
}

func TestSecurityHTTPBodiesNameNoKey(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	secret := secretKey(t)
	gate := make(chan struct{})
	var gated atomic.Bool
	var started sync.WaitGroup
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/gate" && !gated.Swap(true) {
			started.Done()
			<-gate
		}
		if r.URL.Path == "/huge" {
			_, _ = w.Write(make([]byte, 200))
			return
		}
		w.WriteHeader(http.StatusCreated)
	})
	newSrv := func(cfg idemhttp.Config) string {
		cfg.Scope = scopeFromHeader
		cfg.MaxRequestBody, cfg.MaxResponseBody = 100, 100
		cfg.Options = append(cfg.Options, s.Opt)
		mw, err := idemhttp.Middleware(pool, cfg)
		require.NoError(t, err)
		srv := httptest.NewServer(mw(h))
		t.Cleanup(srv.Close)
		return srv.URL
	}
	srv := newSrv(idemhttp.Config{})
	tokenSrv := newSrv(idemhttp.Config{Options: []idem.DoOption{idem.RequireIssued()}})
	check := func(r httpReply, status int, what string) {
		t.Helper()
		require.Equal(t, status, r.status, "%s: %s", what, r.body)
		requireHidden(t, secret, r.body, what)
		for k, vs := range r.header {
			requireHidden(t, secret, k+": "+strings.Join(vs, ","), what)
		}
	}
	user := url.PathEscape("tenant")
	sk := idemhttp.FormatKey(secret)

	// 400: malformed keys, each carrying the secret.
	for name, v := range map[string]string{
		"unterminated":    `"` + secret,
		"bad escape":      `"` + secret + `\n"`,
		"trailing text":   sk + "x",
		"quote unquoted":  secret + `"`,
		"too long":        idemhttp.FormatKey(strings.Repeat(secret, 10)),
		"text after list": sk + `, "b"`,
	} {
		check(post(t, srv, "", v, "x", "X-Scope", user), http.StatusBadRequest, name)
	}
	// 400: a token the server did not issue.
	check(post(t, tokenSrv, "", sk, "x", "X-Scope", user), http.StatusBadRequest, "token unknown")
	// 401 and 500 for scopes, the secret being the scope.
	check(post(t, srv, "", `"k"`, "x", "X-Scope", "%zz"+secret), http.StatusUnauthorized, "scope error")
	check(post(t, srv, "", `"k"`, "x", "X-Scope", url.PathEscape(secret+"\x1f")), http.StatusInternalServerError, "scope invalid")
	// 413 and 500 for sizes.
	check(post(t, srv, "", sk, strings.Repeat("b", 101), "X-Scope", user), http.StatusRequestEntityTooLarge, "request too large")
	check(post(t, srv+"/huge", "", sk, "x", "X-Scope", user), http.StatusInternalServerError, "response too large")
	// 422: the key reused for another body.
	check(post(t, srv, "", sk, "A", "X-Scope", user), http.StatusCreated, "first")
	check(post(t, srv, "", sk, "B", "X-Scope", user), http.StatusUnprocessableEntity, "reused")
	// 409: in flight.
	started.Add(1)
	done := make(chan httpReply)
	go func() { done <- post(t, srv+"/gate", "", idemhttp.FormatKey(secret+"-gate"), "x", "X-Scope", user) }()
	started.Wait()
	check(post(t, srv+"/gate", "", idemhttp.FormatKey(secret+"-gate"), "x", "X-Scope", user), http.StatusConflict, "in flight")
	close(gate)
	check(<-done, http.StatusCreated, "gated first")
}

// SlogHooks, idem's logging hook, logs digests of scopes and keys unless
// ClearKeys is set.
func TestSecurityHooksHashKeys(t *testing.T) {
	pool := pgtest.Pool(t)
	s := pgtest.NewSchema(t, pool)
	c := &counter{s: s}
	ctx := context.Background()
	secret := secretKey(t)
	var logs bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	hooks := idem.WithHooks(idem.SlogHooks{Logger: logger})

	// Every event a call with a secret key can produce.
	key := idem.Key{Scope: secret, ID: secret, Fingerprint: []byte("A")}
	for range 2 {
		_, err := idem.Do(ctx, pool, key, c.fn(key), s.Opt, hooks)
		require.NoError(t, err)
	}
	reused := key
	reused.Fingerprint = []byte("B")
	_, err := idem.Do(ctx, pool, reused, c.fn(reused), s.Opt, hooks)
	require.ErrorIs(t, err, idem.ErrKeyReused)
	lk := idem.Key{Scope: secret, ID: secret + "-lease"}
	l, _, err := idem.Claim[string](ctx, pool, lk, time.Minute, s.Opt, hooks)
	require.NoError(t, err)
	endLease(t, pool, s, lk)
	_, _, err = idem.Claim[string](ctx, pool, lk, time.Minute, s.Opt, hooks)
	require.NoError(t, err)
	require.ErrorIs(t, l.Extend(ctx, pool), idem.ErrLeaseLost)
	// And an event handed to the hook directly, with an error that wraps
	// idem's lease error.
	idem.SlogHooks{Logger: logger}.Event(ctx, idem.Event{Kind: idem.EventLeaseLost, Op: "Extend", Key: lk,
		Err: l.Extend(ctx, pool)})
	requireHidden(t, secret, logs.String(), "slog hooks")
	digest := sha256.Sum256([]byte(secret))
	require.Contains(t, logs.String(), "sha256:"+hex.EncodeToString(digest[:6]))

	// ClearKeys is the opt-in that logs them as they are.
	logs.Reset()
	idem.SlogHooks{Logger: logger, ClearKeys: true}.Event(ctx, idem.Event{Kind: idem.EventReplayed, Op: "Do", Key: key})
	require.Contains(t, logs.String(), secret)
}
