package idemhttp

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// Transport is an http.RoundTripper that makes requests safe to retry: it
// gives every request of the configured methods an Idempotency-Key (unless
// it has one) and retries it with the same key on connection errors,
// timeouts, 409, 429, 502, 503 and 504, with exponential backoff and full
// jitter, honouring Retry-After, within MaxAttempts and MaxElapsed. A server
// running Middleware then answers a retry of a request that already ran with
// the recorded response. The zero value is usable.
type Transport struct {
	// Base sends the requests. It defaults to http.DefaultTransport.
	Base http.RoundTripper
	// Methods that get a key and are retried. It defaults to POST and
	// PATCH; other requests are sent once, untouched.
	Methods []string
	// MaxAttempts bounds the tries of one request. It defaults to 5.
	MaxAttempts int
	// MaxElapsed bounds the time spent on one request, waits included. It
	// defaults to 30s.
	MaxElapsed time.Duration
	// BaseDelay scales the backoff: retry n waits a random duration up to
	// min(MaxDelay, BaseDelay * 2^n), or Retry-After if that is longer. It
	// defaults to 100ms.
	BaseDelay time.Duration
	// MaxDelay caps a backoff. It defaults to 5s.
	MaxDelay time.Duration
	// NewKey makes a key. It defaults to 128 random bits in hex.
	NewKey func() string
}

// RoundTrip sends req, retrying as the Transport describes. It does not
// modify req; the key used is in the returned response's Request (see
// KeyOf). A request with a body is retried only if it has GetBody (as
// http.NewRequest sets for in-memory bodies). Cancelling req's context stops
// the retries.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	methods := t.Methods
	if methods == nil {
		methods = []string{http.MethodPost, http.MethodPatch}
	}
	if !slices.Contains(methods, req.Method) {
		return base.RoundTrip(req)
	}
	maxAttempts := t.MaxAttempts
	if maxAttempts <= 0 {
		maxAttempts = 5
	}
	maxElapsed := t.MaxElapsed
	if maxElapsed <= 0 {
		maxElapsed = 30 * time.Second
	}
	baseDelay, maxDelay := t.BaseDelay, t.MaxDelay
	if baseDelay <= 0 {
		baseDelay = 100 * time.Millisecond
	}
	if maxDelay <= 0 {
		maxDelay = 5 * time.Second
	}

	ctx := req.Context()
	header := req.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	if len(header.Values(HeaderName)) == 0 {
		newKey := t.NewKey
		if newKey == nil {
			newKey = randomKey
		}
		header.Set(HeaderName, FormatKey(newKey()))
	}
	deadline := time.Now().Add(maxElapsed)
	for attempt := 1; ; attempt++ {
		try := req.Clone(ctx)
		try.Header = header
		if attempt > 1 && req.Body != nil && req.Body != http.NoBody {
			body, err := req.GetBody()
			if err != nil {
				return nil, err
			}
			try.Body = body
		}
		resp, err := base.RoundTrip(try)
		if !retryable(resp, err) || attempt >= maxAttempts || ctx.Err() != nil ||
			(req.Body != nil && req.Body != http.NoBody && req.GetBody == nil) {
			return resp, err
		}
		wait := backoff(baseDelay, maxDelay, attempt)
		if resp != nil {
			if ra := retryAfter(resp.Header.Get("Retry-After")); ra > wait {
				wait = ra
			}
		}
		if time.Now().Add(wait).After(deadline) {
			return resp, err // no time for another try: give the caller what we have
		}
		if resp != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		case <-timer.C:
		}
	}
}

// KeyOf returns the Idempotency-Key a response's request carried: the key
// Transport generated, or the caller's own. It returns "" when there is none.
func KeyOf(resp *http.Response) string {
	if resp == nil || resp.Request == nil {
		return ""
	}
	key, err := ParseKey(resp.Request.Header)
	if err != nil {
		return ""
	}
	return key
}

func retryable(resp *http.Response, err error) bool {
	if err != nil {
		if errors.Is(err, context.Canceled) {
			return false
		}
		var ne net.Error
		return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
			errors.Is(err, context.DeadlineExceeded) || isConnError(err)
	}
	switch resp.StatusCode {
	case http.StatusConflict, http.StatusTooManyRequests, http.StatusBadGateway,
		http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
	}
	return false
}

// isConnError recognises the errors a dropped connection gives (reset,
// refused, closed) that do not implement net.Error.
func isConnError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

func backoff(base, maxDelay time.Duration, attempt int) time.Duration {
	d := base << min(attempt, 30)
	if d <= 0 || d > maxDelay {
		d = maxDelay
	}
	return rand.N(d + 1)
}

// retryAfter parses Retry-After as seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

func randomKey() string {
	b := make([]byte, 16)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}
