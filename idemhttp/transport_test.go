package idemhttp

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// A server answering 429 (with Retry-After), 503 and 502 before a 201 gets
// four tries with one key and the same body; the client sees the 201.
func TestTransportRetriesWithTheSameKey(t *testing.T) {
	var mu sync.Mutex
	var keys, bodies []string
	statuses := []int{http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusCreated}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		n := len(keys)
		keys = append(keys, r.Header.Get(HeaderName))
		bodies = append(bodies, string(b))
		mu.Unlock()
		if statuses[n] == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "0")
		}
		w.WriteHeader(statuses[n])
	}))
	defer srv.Close()
	client := &http.Client{Transport: &Transport{BaseDelay: time.Millisecond}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("the body"))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || len(keys) != 4 {
		t.Fatalf("status %d after %d tries", resp.StatusCode, len(keys))
	}
	for i := range keys {
		if keys[i] != keys[0] || bodies[i] != "the body" {
			t.Fatalf("try %d: key %q body %q (first key %q)", i, keys[i], bodies[i], keys[0])
		}
	}
	if got, _ := parseValue(keys[0]); KeyOf(resp) != got || got == "" {
		t.Fatalf("KeyOf = %q, sent %q", KeyOf(resp), keys[0])
	}
	if req.Header.Get(HeaderName) != "" {
		t.Fatal("the caller's request was modified")
	}
}

func TestTransportBoundsAndKeepsCallerKey(t *testing.T) {
	var tries atomic.Int64
	var seen atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tries.Add(1)
		seen.Store(r.Header.Get(HeaderName))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	client := &http.Client{Transport: &Transport{BaseDelay: time.Millisecond, MaxAttempts: 3}}
	req, _ := http.NewRequest(http.MethodPatch, srv.URL, nil)
	req.Header.Set(HeaderName, `"mine"`)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || tries.Load() != 3 || seen.Load() != `"mine"` {
		t.Fatalf("status %d, %d tries, key %v", resp.StatusCode, tries.Load(), seen.Load())
	}

	// GET is neither keyed nor retried.
	tries.Store(0)
	resp, err = client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if tries.Load() != 1 || seen.Load() != "" {
		t.Fatalf("GET: %d tries, key %v", tries.Load(), seen.Load())
	}

	// MaxElapsed stops the retries early; a cancelled context at once.
	tries.Store(0)
	client.Transport = &Transport{BaseDelay: 5 * time.Second, MaxDelay: time.Minute, MaxElapsed: 100 * time.Millisecond, MaxAttempts: 10}
	req, _ = http.NewRequest(http.MethodPost, srv.URL, nil)
	if resp, err = client.Do(req); err == nil {
		resp.Body.Close()
	}
	if tries.Load() > 2 {
		t.Fatalf("MaxElapsed: %d tries", tries.Load())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	client.Transport = &Transport{BaseDelay: time.Second, MaxDelay: time.Second, MaxAttempts: 10, MaxElapsed: time.Minute}
	req, _ = http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, nil)
	started := time.Now()
	if resp, err = client.Do(req); err == nil {
		resp.Body.Close()
	}
	if time.Since(started) > 5*time.Second {
		t.Fatal("the cancelled context did not stop the retries")
	}
}
