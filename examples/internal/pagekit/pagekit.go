// Package pagekit holds what the example pages share: their stylesheet,
// panel.js (the script that sends the pages' requests and shows each one in
// the "Behind the scenes" panel), the server side of panel.js's "drop the
// next response" switch, and the JSON and problem answers the pages read.
package pagekit

import (
	"embed"
	"encoding/json"
	"net/http"
)

//go:embed style.css panel.js
var files embed.FS

// Prefix is the path the pages load the shared files from.
const Prefix = "/kit/"

// Handler serves the shared files under Prefix.
func Handler() http.Handler { return http.StripPrefix(Prefix, http.FileServerFS(files)) }

// JSON answers v as JSON with status.
func JSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// Problem answers an RFC 9457 problem, shaped like idemhttp's own, so that
// a page reads every refusal the same way: code for the program, detail for
// the person.
func Problem(w http.ResponseWriter, status int, code, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status,
		"code": code, "detail": detail,
	})
}

// DropHeader is set by panel.js's "drop the next response" switch.
const DropHeader = "X-Demo-Drop-Response"

// DropResponses loses answers on request, for the demo: a request carrying
// DropHeader runs as usual (the middleware commits its writes and records
// its answer), then the connection is cut without a response, as when a
// phone leaves the network at the wrong moment. The page cannot tell
// whether its request took effect, so it resends with the same key and gets
// the recorded answer, marked Idempotent-Replayed: true. A header rather
// than a query flag, since the query is part of the request's fingerprint:
// the resend, without it, is the same request. A real service has no such
// switch.
func DropResponses(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(DropHeader) == "" {
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(discard{http.Header{}}, r) // committed here
		panic(http.ErrAbortHandler)               // net/http closes the connection, answering nothing
	})
}

// discard is a ResponseWriter that throws the response away.
type discard struct{ header http.Header }

func (d discard) Header() http.Header       { return d.header }
func (discard) WriteHeader(int)             {}
func (discard) Write(p []byte) (int, error) { return len(p), nil }
