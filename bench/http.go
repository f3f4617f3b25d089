package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

var (
	bareServer, doServer, idemServer, waitServer, noHoldServer *httptest.Server
	httpClient                                                 *http.Client
)

// insertOrder is the business write both servers do.
func insertOrder(ctx context.Context, tx pgx.Tx, w http.ResponseWriter) {
	id, err := insertRow(ctx, tx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]int64{"id": id})
}

func setupHTTP(ctx context.Context, pool *pgxpool.Pool) error {
	bareServer = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := pool.Begin(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer tx.Rollback(r.Context()) //nolint:errcheck
		rec := &statusWriter{ResponseWriter: w}
		insertOrder(r.Context(), tx, rec)
		if rec.status == http.StatusCreated {
			_ = tx.Commit(r.Context())
		}
	}))
	// The handler calling idem.Do itself, with the header's key and the
	// middleware's defaults (NoWait: a duplicate in flight is answered at
	// once; a one-minute hold timeout), but no fingerprint, recorder or
	// problem responses: what the record costs an HTTP request, the floor
	// under any middleware.
	doServer = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, err := idemhttp.ParseKey(r.Header)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		res, err := idem.Do(r.Context(), pool, idem.Key{Scope: "bench-do", ID: key}, func(ctx context.Context, tx pgx.Tx) (int64, error) {
			return insertRow(ctx, tx)
		}, tableOpt, idem.NoWait(), idem.WithHoldTimeout(idemhttp.DefaultHoldTimeout))
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]int64{"id": res.Value})
	}))
	mw, err := idemhttp.Middleware(pool, idemhttp.Config{
		Scope:   func(*http.Request) (string, error) { return "bench", nil },
		Options: []idem.DoOption{tableOpt},
	})
	if err != nil {
		return err
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		insertOrder(r.Context(), idemhttp.Tx(r.Context()), w)
	})
	idemServer = httptest.NewServer(mw(handler))
	// The same without a hold timeout: what the default bound costs.
	noHoldMW, err := idemhttp.Middleware(pool, idemhttp.Config{
		Scope:       func(*http.Request) (string, error) { return "bench-nohold", nil },
		HoldTimeout: -1,
		Options:     []idem.DoOption{tableOpt},
	})
	if err != nil {
		return err
	}
	noHoldServer = httptest.NewServer(noHoldMW(handler))
	// With Wait, a request whose key is in flight waits instead of getting
	// a 409, and the claim needs no lock_timeout of its own.
	waitMW, err := idemhttp.Middleware(pool, idemhttp.Config{
		Scope:   func(*http.Request) (string, error) { return "bench-wait", nil },
		Wait:    true,
		Options: []idem.DoOption{tableOpt},
	})
	if err != nil {
		return err
	}
	waitServer = httptest.NewServer(waitMW(handler))
	httpClient = &http.Client{Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	// The replay variant answers every request from this key's record.
	return postOrder(ctx, idemServer.URL, replayKey)
}

const replayKey = "the-replayed-key"

// statusWriter remembers the status the handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func postOrder(ctx context.Context, url, key string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"amount": 999}`))
	if err != nil {
		return err
	}
	if key != "" {
		req.Header.Set(idemhttp.HeaderName, idemhttp.FormatKey(key))
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusCreated && !(resp.StatusCode == http.StatusConflict && dupRate > 0) {
		return fmt.Errorf("%s: status %d", url, resp.StatusCode)
	}
	return nil
}

// httpVariants: the same handler with its own bare transaction, calling
// idem.Do itself, behind the middleware with a new key per request (by
// default, without the default hold timeout, and with Config.Wait), and
// behind the middleware replaying one key.
var httpVariants = []variant{
	{"bare handler", func(ctx context.Context, _ *pgxpool.Pool, _ idem.Key) error {
		return postOrder(ctx, bareServer.URL, "")
	}},
	{"handler calling Do", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		return postOrder(ctx, doServer.URL, key.ID)
	}},
	{"middleware", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		return postOrder(ctx, idemServer.URL, key.ID)
	}},
	{"middleware, no HoldTimeout", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		return postOrder(ctx, noHoldServer.URL, key.ID)
	}},
	{"middleware, Wait", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		return postOrder(ctx, waitServer.URL, key.ID)
	}},
	{"middleware, replay", func(ctx context.Context, _ *pgxpool.Pool, _ idem.Key) error {
		return postOrder(ctx, idemServer.URL, replayKey)
	}},
}
