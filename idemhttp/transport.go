package idemhttp

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idemkit/idem/internal/backoff"
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
	// MaxElapsed bounds the time spent on one request until a response's
	// headers arrive, waits and tries included: a try still waiting for its
	// response at that time is cancelled. Reading the body of the response
	// returned is not bounded. It defaults to 30s.
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
// KeyOf), or, when RoundTrip returns an error, in the error (see
// KeyOfError): the request may have run, and retrying it later with that key
// is safe. A request with a body is retried only if it has GetBody (as
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
	key, _ := ParseKey(header)
	deadline := time.Now().Add(maxElapsed)
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithCancel(ctx)
		try := req.Clone(actx)
		try.Header = header
		if attempt > 1 && req.Body != nil && req.Body != http.NoBody {
			body, err := req.GetBody()
			if err != nil {
				cancel()
				return nil, &keyError{key: key, err: err}
			}
			try.Body = body
		}
		// The try is cancelled if no response has come by the deadline.
		timer := time.AfterFunc(time.Until(deadline), cancel)
		resp, err := base.RoundTrip(try)
		expired := !timer.Stop()
		if err == nil && expired {
			// The headers came as the deadline passed: the try's context
			// is cancelled already, so its body cannot be read.
			if resp.Body != nil {
				resp.Body.Close()
			}
			resp, err = nil, context.Canceled
		}
		if err != nil {
			cancel()
			if expired && ctx.Err() == nil {
				err = fmt.Errorf("idemhttp: no response within MaxElapsed (%v): %w", maxElapsed, context.DeadlineExceeded)
			}
			err = &keyError{key: key, err: schemeMismatch(err)}
		} else {
			resp.Body = cancelOnClose(resp.Body, cancel)
		}
		if expired || !retryable(resp, err) || attempt >= maxAttempts || ctx.Err() != nil ||
			(req.Body != nil && req.Body != http.NoBody && req.GetBody == nil) {
			return resp, err
		}
		wait := backoff.Full(baseDelay, maxDelay, attempt)
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
		wake := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			wake.Stop()
			return nil, &keyError{key: key, err: ctx.Err()}
		case <-wake.C:
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

// KeyOfError returns the Idempotency-Key of the request that a Transport's
// RoundTrip (or an http.Client using it) failed with err: the request may
// have run on the server, and sending it again with this key later is safe.
// It returns "" when err did not come from a Transport.
func KeyOfError(err error) string {
	var ke *keyError
	if errors.As(err, &ke) {
		return ke.key
	}
	return ""
}

// keyError is an error of RoundTrip, with the key its request carried. Its
// text is the error's own.
type keyError struct {
	key string
	err error
}

func (e *keyError) Error() string { return e.err.Error() }
func (e *keyError) Unwrap() error { return e.err }

// Timeout reports whether the error is a timeout, as net.Error does, so
// that url.Error and http.Client see through the wrapping.
func (e *keyError) Timeout() bool {
	var ne net.Error
	return errors.Is(e.err, context.DeadlineExceeded) || (errors.As(e.err, &ne) && ne.Timeout())
}

// schemeMismatch turns the error of an https request answered in plain
// HTTP into http.ErrSchemeMismatch, as http.Client does for errors it can
// see unwrapped.
func schemeMismatch(err error) error {
	var rhe tls.RecordHeaderError
	if errors.As(err, &rhe) && string(rhe.RecordHeader[:]) == "HTTP/" {
		return http.ErrSchemeMismatch
	}
	return err
}

// cancelOnClose ends a try's context when its response body is closed (at
// once when there is no body). A body that is also a Writer (a 101
// Switching Protocols) stays one.
func cancelOnClose(body io.ReadCloser, cancel context.CancelFunc) io.ReadCloser {
	if body == nil || body == http.NoBody {
		cancel()
		return http.NoBody
	}
	b := &cancelReadCloser{ReadCloser: body, cancel: cancel}
	if w, ok := body.(io.Writer); ok {
		return &cancelReadWriteCloser{cancelReadCloser: b, Writer: w}
	}
	return b
}

type cancelReadCloser struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelReadCloser) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

var _ io.ReadWriteCloser = (*cancelReadWriteCloser)(nil)

// cancelReadWriteCloser is cancelReadCloser for a body that is a Writer too.
type cancelReadWriteCloser struct {
	*cancelReadCloser
	io.Writer
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

// retryAfter parses Retry-After as seconds or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil && s >= 0 {
		// Anything past a year (or past time.Duration) is "not before the
		// deadline": a year stands for it.
		const year = 365 * 24 * time.Hour
		return time.Duration(min(s, int64(year/time.Second))) * time.Second
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
