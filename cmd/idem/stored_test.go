package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// pngBody is a body that is not text: a PNG's signature and more.
var pngBody = append([]byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"), bytes.Repeat([]byte{0, 0xff}, 100)...)

// recordThroughMiddleware runs idemhttp's middleware in schema s: one
// request with key "order-7", answered with JSON, and one with key
// "avatar", answered with a PNG.
func recordThroughMiddleware(t *testing.T, s string) {
	pool := testPool(t)
	mw, err := idemhttp.Middleware(pool, idemhttp.Config{
		Scope:   func(*http.Request) (string, error) { return "customer-42", nil },
		Options: []idem.DoOption{idem.WithTable(s, idem.DefaultTable)},
	})
	require.NoError(t, err)
	srv := httptest.NewServer(mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/avatar" {
			w.Header().Set("Content-Type", "image/png")
			_, _ = w.Write(pngBody)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/orders/7")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]any{"id": 7, "charged": "9.99 EUR"})
	})))
	t.Cleanup(srv.Close)
	for key, path := range map[string]string{"order-7": "/orders", "avatar": "/avatar"} {
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(`{}`))
		require.NoError(t, err)
		req.Header.Set(idemhttp.HeaderName, `"`+key+`"`)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
	}
}

// inspect shows what idemhttp recorded: the status, the headers and the
// body, as text when it is text, else as its size and a hex preview.
func TestInspectShowsAnHTTPResponse(t *testing.T) {
	_, s := migrated(t)
	recordThroughMiddleware(t, s)

	code, out, errOut := cli(t, "inspect", "--schema", s, "--scope", "customer-42", "--key", "order-7")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^status +succeeded$`, out)
	require.Regexp(t, `(?m)^response +HTTP 201 Created \(recorded by idemhttp\)$`, out)
	require.Regexp(t, `(?m)^  Content-Type +application/json$`, out)
	require.Regexp(t, `(?m)^  Location +/orders/7$`, out)
	require.Regexp(t, `(?m)^  body +\{"charged":"9.99 EUR","id":7\}$`, out)
	require.NotContains(t, out, "bytes:", "no opaque bytes")

	code, out, errOut = cli(t, "inspect", "--schema", s, "--scope", "customer-42", "--key", "order-7", "--json")
	require.Equal(t, exitOK, code, errOut)
	var rec struct {
		Format   string         `json:"format"`
		Response map[string]any `json:"response"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Equal(t, "idemhttp", rec.Format)
	require.Equal(t, map[string]any{
		"status":    201.0,
		"headers":   map[string]any{"Content-Type": []any{"application/json"}, "Location": []any{"/orders/7"}},
		"body":      `{"charged":"9.99 EUR","id":7}` + "\n",
		"body_size": float64(len(`{"charged":"9.99 EUR","id":7}` + "\n")),
	}, rec.Response)

	code, out, errOut = cli(t, "inspect", "--schema", s, "--scope", "customer-42", "--key", "avatar")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^response +HTTP 200 OK \(recorded by idemhttp\)$`, out)
	require.Regexp(t, `(?m)^  Content-Type +image/png$`, out)
	require.Regexp(t, `(?m)^  body +216 bytes, not text: 89504e470d0a1a0a0000000d49484452(00ff){24}\.\.\.$`, out)

	code, out, errOut = cli(t, "inspect", "--schema", s, "--scope", "customer-42", "--key", "avatar", "--json")
	require.Equal(t, exitOK, code, errOut)
	rec.Response = nil
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Equal(t, "idemhttp", rec.Format)
	require.Equal(t, 200.0, rec.Response["status"])
	require.Equal(t, 216.0, rec.Response["body_size"])
	require.Equal(t, "89504e470d0a1a0a0000000d49484452"+strings.Repeat("00ff", 24), rec.Response["body_hex_preview"])
	whole, err := base64.StdEncoding.DecodeString(rec.Response["body_base64"].(string))
	require.NoError(t, err)
	require.Equal(t, pngBody, whole, "the whole body, in base64")
	require.NotContains(t, rec.Response, "body", "a body that is not text is not given as text")
}

// stuck decodes checkpoint data in idemhttp's format as inspect does.
func TestStuckShowsAnHTTPResponse(t *testing.T) {
	ctx := context.Background()
	pool, s := migrated(t)
	recordThroughMiddleware(t, s)
	opt := idem.WithTable(s, idem.DefaultTable)
	recorded, err := idem.Lookup(ctx, pool, "customer-42", "order-7", opt)
	require.NoError(t, err)

	// A lease whose holder stopped, holding those bytes as its checkpoint
	// data; its lease ended.
	_, _, err = idem.Claim[string](ctx, pool, idem.Key{Scope: "customer-42", ID: "refund-7"}, time.Minute, opt)
	require.NoError(t, err)
	_, err = pool.Exec(ctx, `UPDATE `+pgx.Identifier{s, idem.DefaultTable}.Sanitize()+`
		SET response = $1, recovery_point = 'refund-sent', locked_until = now() - interval '1 second' WHERE key = 'refund-7'`, recorded.Response)
	require.NoError(t, err)

	code, out, errOut := cli(t, "stuck", "--schema", s)
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^customer-42 +refund-7 +1 .* refund-sent +HTTP 201: \{"charged":"9.99 EUR","id":7\} +`, out)

	code, out, errOut = cli(t, "stuck", "--schema", s, "--json")
	require.Equal(t, exitOK, code, errOut)
	var stuck []struct {
		Format         string         `json:"format"`
		CheckpointData map[string]any `json:"checkpoint_data"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &stuck))
	require.Len(t, stuck, 1)
	require.Equal(t, "idemhttp", stuck[0].Format)
	require.Equal(t, 201.0, stuck[0].CheckpointData["status"])
	require.Equal(t, map[string]any{"Content-Type": []any{"application/json"}, "Location": []any{"/orders/7"}}, stuck[0].CheckpointData["headers"])
	require.Equal(t, `{"charged":"9.99 EUR","id":7}`+"\n", stuck[0].CheckpointData["body"])

	code, out, errOut = cli(t, "inspect", "--schema", s, "--scope", "customer-42", "--key", "refund-7")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^checkpoint data +HTTP 201 Created \(recorded by idemhttp\)$`, out)
}

func TestDescribeBody(t *testing.T) {
	for body, want := range map[string]string{
		"":                      "(empty)",
		"plain text\n":          "plain text",
		"{\n  \"a\": [1, 2]\n}": `{"a":[1,2]}`,
		"two\nlines\n":          `"two\nlines"`,
		"tab\there":             `"tab\there"`,
		"caf\u00e9":             "caf\u00e9",
		"\x00\x01":              "2 bytes, not text: 0001",
		"\xff":                  "1 byte, not text: ff",
		"bell\a":                "5 bytes, not text: 62656c6c07",
	} {
		require.Equal(t, want, describeBody([]byte(body)), "%q", body)
	}
	long := strings.Repeat("é", 3000) // 6000 bytes: cut on a character
	got := describeBody([]byte(long))
	require.Equal(t, strings.Repeat("é", 2048)+"... (6000 bytes in all)", got)
}

// Stored bytes that are not a response idemhttp recorded are shown as
// before: JSON as it is, others as their size and a hex preview.
func TestFormatOf(t *testing.T) {
	for b, want := range map[string]string{
		`{"status":201}`:   formatJSON,
		`"\u0001"`:         formatJSON,
		"\x01\x00\xc9\x00": formatIdemHTTP,
		"\x01\x00\x09\x00": formatBytes, // status 9
		"\x01\x00":         formatBytes,
		"gob or anything":  formatText,
		"\x00\xffbinary":   formatBytes,
	} {
		got, _ := formatOf([]byte(b))
		require.Equal(t, want, got, "%q", b)
	}
	require.Equal(t, "1 byte: 01", describe([]byte{1}))
}

// A failed record's message (a Permanent error) is shown as its text,
// under "error", in inspect and stuck alike.
func TestInspectShowsAFailure(t *testing.T) {
	pool, s := migrated(t)
	ctx := context.Background()
	key := idem.Key{Scope: "customer-42", ID: "pay-9"}
	_, err := idem.Do(ctx, pool, key, func(context.Context, pgx.Tx) (string, error) {
		return "", idem.Permanent(errors.New("card declined"))
	}, idem.WithTable(s, idem.DefaultTable))
	require.True(t, idem.IsPermanent(err), "%v", err)

	code, out, errOut := cli(t, "inspect", "--schema", s, "--scope", "customer-42", "--key", "pay-9")
	require.Equal(t, exitOK, code, errOut)
	require.Regexp(t, `(?m)^status +failed$`, out)
	require.Regexp(t, `(?m)^error +card declined$`, out)

	code, out, errOut = cli(t, "inspect", "--schema", s, "--scope", "customer-42", "--key", "pay-9", "--json")
	require.Equal(t, exitOK, code, errOut)
	var rec struct {
		Format   string `json:"format"`
		Response string `json:"response"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rec))
	require.Equal(t, "text", rec.Format)
	require.Equal(t, "card declined", rec.Response)
}
