package idemhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
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

// When every try fails without a response, the error carries the key: the
// request may have run, and the caller can send it again with that key.
func TestTransportErrorCarriesTheKey(t *testing.T) {
	var seen atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get(HeaderName))
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // no response at all
		}
	}))
	defer srv.Close()
	client := &http.Client{Transport: &Transport{BaseDelay: time.Millisecond, MaxAttempts: 2}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, err := client.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("a server that never answers gave a response")
	}
	sent, _ := parseValue(seen.Load().(string))
	if got := KeyOfError(err); got == "" || got != sent {
		t.Fatalf("KeyOfError(%v) = %q, the server saw %q", err, got, sent)
	}
	if KeyOfError(io.EOF) != "" {
		t.Fatal("KeyOfError of a foreign error")
	}
}

// MaxElapsed bounds a try that is still waiting for its response: a server
// that never answers the second try does not hold the caller past it.
func TestTransportMaxElapsedCancelsAHangingTry(t *testing.T) {
	release := make(chan struct{})
	var tries atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tries.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		select { // hang until the test ends or the client gives up
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	// MaxElapsed leaves the first try and the retry time to start on a
	// loaded machine; the second try then hangs until it passes.
	client := &http.Client{Transport: &Transport{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, MaxElapsed: 2 * time.Second}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	done := make(chan error, 1)
	go func() {
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) || KeyOfError(err) == "" {
			t.Fatalf("err = %v (key %q), want a deadline with the key", err, KeyOfError(err))
		}
		var ue *url.Error
		if !errors.As(err, &ue) || !ue.Timeout() {
			t.Fatalf("http.Client does not see a timeout in %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the hanging try was not cancelled at MaxElapsed")
	}
	if tries.Load() != 2 {
		t.Fatalf("%d tries, want 2", tries.Load())
	}
}

// A response body read after RoundTrip returned is not cut by MaxElapsed.
func TestTransportBodyOutlivesMaxElapsed(t *testing.T) {
	// The headers come at once, well within MaxElapsed however loaded the
	// machine; the body only once MaxElapsed has passed.
	const maxElapsed = time.Second
	release := make(chan struct{})
	var once sync.Once
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, "late body")
	}))
	defer srv.Close()
	defer once.Do(func() { close(release) })
	client := &http.Client{Transport: &Transport{MaxElapsed: maxElapsed}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The Transport's deadline was set before Do returned: it has passed
	// once MaxElapsed has from here.
	time.Sleep(maxElapsed + 10*time.Millisecond)
	once.Do(func() { close(release) })
	b, err := io.ReadAll(resp.Body)
	if err != nil || string(b) != "late body" {
		t.Fatalf("body %q, err %v", b, err)
	}
}

func TestRetryAfterClamps(t *testing.T) {
	for _, v := range []string{"9999999999", "18446744074", "9223372036854775807"} {
		if d := retryAfter(v); d < 24*time.Hour {
			t.Errorf("retryAfter(%s) = %v, want at least a day", v, d)
		}
	}
	if d := retryAfter("3"); d != 3*time.Second {
		t.Errorf("retryAfter(3) = %v", d)
	}
	if d := retryAfter("-1"); d != 0 {
		t.Errorf("retryAfter(-1) = %v", d)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// A Base that returns a nil Body, which http.Client tolerates, gives an
// empty body, not a wrapper around nil.
func TestTransportNilBodyFromBase(t *testing.T) {
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusCreated, Header: http.Header{}, Request: r}, nil
	})
	client := &http.Client{Transport: &Transport{Base: base}}
	req, _ := http.NewRequest(http.MethodPost, "http://example.invalid/", strings.NewReader("x"))
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil || len(b) != 0 {
		t.Fatalf("body %q, err %v", b, err)
	}
	if err := resp.Body.Close(); err != nil {
		t.Fatal(err)
	}
}

// Headers that arrive only after MaxElapsed (here a Base that works on
// after its RoundTrip) would come with a body whose context is cancelled:
// the Transport answers the deadline instead, with the key.
func TestTransportAnswerAfterMaxElapsedIsADeadline(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "body")
	}))
	defer srv.Close()
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := http.DefaultTransport.RoundTrip(r)
		<-r.Context().Done() // still busy when the deadline passes
		return resp, err
	})
	client := &http.Client{Transport: &Transport{Base: base, MaxElapsed: 100 * time.Millisecond}}
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader("x"))
	resp, err := client.Do(req)
	if err == nil {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		t.Fatalf("got %d %q (read error %v), want the deadline", resp.StatusCode, b, rerr)
	}
	if !errors.Is(err, context.DeadlineExceeded) || KeyOfError(err) == "" {
		t.Fatalf("err = %v (key %q)", err, KeyOfError(err))
	}
}

// An https request answered in plain HTTP is http.ErrSchemeMismatch, as
// through http.DefaultTransport.
func TestTransportSchemeMismatch(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	url := "https" + strings.TrimPrefix(srv.URL, "http")
	for _, rt := range []http.RoundTripper{http.DefaultTransport, &Transport{MaxAttempts: 1}} {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader("x"))
		resp, err := (&http.Client{Transport: rt}).Do(req)
		if err == nil {
			resp.Body.Close()
		}
		if !errors.Is(err, http.ErrSchemeMismatch) {
			t.Errorf("%T: %v is not http.ErrSchemeMismatch", rt, err)
		}
	}
}
