package idemhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/internal/backoff"
)

// What Transport retries: connection errors, timeouts, and 409, 429, 502,
// 503 and 504; never a cancelled request or another status.
func TestRetryable(t *testing.T) {
	t.Parallel()

	for _, status := range []int{409, 429, 502, 503, 504} {
		require.True(t, retryable(&http.Response{StatusCode: status}, nil), "%d", status)
	}
	for _, status := range []int{200, 201, 204, 301, 400, 401, 404, 408, 422, 500, 501, 505} {
		require.False(t, retryable(&http.Response{StatusCode: status}, nil), "%d", status)
	}
	for _, err := range []error{
		io.EOF,
		io.ErrUnexpectedEOF,
		context.DeadlineExceeded,
		&net.OpError{Op: "dial", Err: errors.New("connection refused")},
		&net.DNSError{Err: "timeout", IsTimeout: true},
		fmt.Errorf("reading: %w", io.ErrUnexpectedEOF),
	} {
		require.True(t, retryable(nil, err), "%v", err)
	}
	for _, err := range []error{
		context.Canceled,
		fmt.Errorf("try: %w", context.Canceled),
		errors.New("net/http: invalid header field name"),
	} {
		require.False(t, retryable(nil, err), "%v", err)
	}
}

// Retry n waits at most min(maxDelay, base * 2^n), however large n is.
func TestTransportBackoff(t *testing.T) {
	t.Parallel()

	base, maxDelay := 10*time.Millisecond, time.Second
	for attempt := 1; attempt <= 70; attempt++ {
		bound := maxDelay
		if attempt < 7 {
			bound = base << attempt
		}
		for range 50 {
			d := backoff.Full(base, maxDelay, attempt)
			require.GreaterOrEqual(t, d, time.Duration(0))
			require.LessOrEqual(t, d, bound, "attempt %d", attempt)
		}
	}
}

func TestRetryAfterForms(t *testing.T) {
	t.Parallel()

	require.Zero(t, retryAfter(""))
	require.Zero(t, retryAfter("soon"))
	require.Zero(t, retryAfter("1.5"))
	require.Equal(t, time.Duration(0), retryAfter("0"))
	require.Equal(t, 120*time.Second, retryAfter("120"))

	// An HTTP date: the time until then, and nothing for a date past.
	d := retryAfter(time.Now().Add(10 * time.Second).UTC().Format(http.TimeFormat))
	require.Greater(t, d, 8*time.Second)
	require.LessOrEqual(t, d, 10*time.Second)
	require.Zero(t, retryAfter(time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat)))
}

// countingServer answers each request with the next status of statuses
// (the last one repeated) and keeps the keys it saw.
type countingServer struct {
	*httptest.Server
	mu   sync.Mutex
	keys []string
}

func newCountingServer(t *testing.T, statuses ...int) *countingServer {
	s := &countingServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.mu.Lock()
		n := len(s.keys)
		s.keys = append(s.keys, r.Header.Get(HeaderName))
		s.mu.Unlock()
		w.WriteHeader(statuses[min(n, len(statuses)-1)])
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *countingServer) seen() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// A status that is the server's final word is returned at once.
func TestTransportDoesNotRetryFinalAnswers(t *testing.T) {
	t.Parallel()

	for _, status := range []int{http.StatusCreated, http.StatusBadRequest, http.StatusUnprocessableEntity, http.StatusInternalServerError} {
		srv := newCountingServer(t, status)
		client := &http.Client{Transport: &Transport{BaseDelay: time.Millisecond}}
		resp, err := client.Post(srv.URL, "text/plain", strings.NewReader("x"))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, status, resp.StatusCode)
		require.Len(t, srv.seen(), 1, "status %d", status)
	}
}

// A body that cannot be read again (no GetBody) is sent once: the first
// answer is returned even when it invites a retry.
func TestTransportSendsAnUnreplayableBodyOnce(t *testing.T) {
	t.Parallel()

	srv := newCountingServer(t, http.StatusServiceUnavailable, http.StatusCreated)
	client := &http.Client{Transport: &Transport{BaseDelay: time.Millisecond}}
	req, err := http.NewRequest(http.MethodPost, srv.URL, io.MultiReader(strings.NewReader("streamed")))
	require.NoError(t, err)
	require.Nil(t, req.GetBody)
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusServiceUnavailable, resp.StatusCode)
	require.Len(t, srv.seen(), 1)
	require.NotEmpty(t, KeyOf(resp), "the key to retry with later")
}

// Methods replaces the default POST and PATCH.
func TestTransportMethods(t *testing.T) {
	t.Parallel()

	srv := newCountingServer(t, http.StatusServiceUnavailable, http.StatusOK)
	client := &http.Client{Transport: &Transport{Methods: []string{http.MethodPut}, BaseDelay: time.Millisecond}}

	req, err := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader("x"))
	require.NoError(t, err)
	resp, err := client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	keys := srv.seen()
	require.Len(t, keys, 2)
	require.NotEmpty(t, keys[0])
	require.Equal(t, keys[0], keys[1])

	resp, err = client.Post(srv.URL, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	require.Len(t, srv.seen(), 3, "POST is sent once")
	require.Empty(t, srv.seen()[2], "POST gets no key")
}

// The default key is 128 random bits in hex, new for every request.
func TestTransportDefaultKeys(t *testing.T) {
	t.Parallel()

	srv := newCountingServer(t, http.StatusCreated)
	client := &http.Client{Transport: &Transport{}}
	for range 2 {
		resp, err := client.Post(srv.URL, "text/plain", nil)
		require.NoError(t, err)
		resp.Body.Close()
	}
	keys := srv.seen()
	require.Len(t, keys, 2)
	for _, k := range keys {
		require.Regexp(t, `^"[0-9a-f]{32}"$`, k)
	}
	require.NotEqual(t, keys[0], keys[1])
}

func TestKeyOfWithoutAKey(t *testing.T) {
	t.Parallel()

	require.Empty(t, KeyOf(nil))
	require.Empty(t, KeyOf(&http.Response{}))
	require.Empty(t, KeyOf(&http.Response{Request: httptest.NewRequest(http.MethodPost, "/", nil)}))
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set(HeaderName, `"k-1"`)
	require.Equal(t, "k-1", KeyOf(&http.Response{Request: r}))
	require.Empty(t, KeyOfError(nil))
}
