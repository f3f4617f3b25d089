package idemgrpc

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/internal/backoff"
)

// ClientConfig configures UnaryClientInterceptor. The zero value is usable.
type ClientConfig struct {
	// Methods lists the full method names ("/package.Service/Method") that
	// get a key and are retried; other calls are made once, untouched. Nil
	// means every unary method; a non-nil empty slice, none.
	Methods []string
	// MaxAttempts bounds the attempts of one call, the first included. It
	// defaults to 5.
	MaxAttempts int
	// AttemptTimeout bounds each attempt; an attempt that runs out is
	// retried (DeadlineExceeded) while the call's own deadline allows. It
	// defaults to none: each attempt has the call's deadline.
	AttemptTimeout time.Duration
	// BaseDelay scales the backoff: retry n waits a random duration up to
	// min(MaxDelay, BaseDelay * 2^n), or the server's RetryInfo delay if
	// that is longer. It defaults to 100ms.
	BaseDelay time.Duration
	// MaxDelay caps a backoff. It defaults to 5s. A RetryInfo delay is not
	// capped, but the call's deadline still bounds the call.
	MaxDelay time.Duration
	// NewKey makes a key for a call that has none. It defaults to NewKey.
	NewKey func() string
}

// UnaryClientInterceptor returns the client interceptor that makes calls
// safe to retry: a call of its methods without a key gets one (NewKey, or
// the key WithKey put in its context, or an idempotency-key already in its
// outgoing metadata), and an attempt that fails with Unavailable,
// DeadlineExceeded (while the call's own context is not done), Aborted or
// ResourceExhausted is retried with the same key, after a jittered
// exponential backoff or the RetryInfo delay the server sent if that is
// longer, within MaxAttempts. It never waits past the call's deadline: when
// the next attempt could not start before it, the last error is returned.
// Install it with grpc.WithUnaryInterceptor or
// grpc.WithChainUnaryInterceptor.
//
// An error of a covered call is a *CallError carrying the key, so the caller
// can retry later with it (WithKey); status.Code and status.FromError see
// through it. A key the caller gave that is unusable (see ParseKey) fails the
// call with InvalidArgument before anything is sent.
func UnaryClientInterceptor(cfg ClientConfig) grpc.UnaryClientInterceptor {
	var methods map[string]bool
	if cfg.Methods != nil {
		methods = map[string]bool{}
		for _, m := range cfg.Methods {
			methods[m] = true
		}
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = 5
	}
	if cfg.BaseDelay <= 0 {
		cfg.BaseDelay = 100 * time.Millisecond
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = 5 * time.Second
	}
	if cfg.NewKey == nil {
		cfg.NewKey = NewKey
	}
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if methods != nil && !methods[method] {
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		ctx, key, err := withCallKey(ctx, cfg.NewKey)
		if err != nil {
			return err
		}
		for attempt := 1; ; attempt++ {
			actx, cancel := ctx, context.CancelFunc(func() {})
			if cfg.AttemptTimeout > 0 {
				actx, cancel = context.WithTimeout(ctx, cfg.AttemptTimeout)
			}
			err := invoker(actx, method, req, reply, cc, opts...)
			cancel()
			if err == nil {
				return nil
			}
			st := status.Convert(err)
			if attempt >= cfg.MaxAttempts || !retryable(st.Code()) || ctx.Err() != nil {
				return &CallError{Key: key, Attempts: attempt, Err: err}
			}
			wait := max(backoff.Full(cfg.BaseDelay, cfg.MaxDelay, attempt), retryDelay(st))
			if dl, ok := ctx.Deadline(); ok && time.Now().Add(wait).After(dl) {
				return &CallError{Key: key, Attempts: attempt, Err: err}
			}
			if serr := backoff.Sleep(ctx, wait); serr != nil {
				return &CallError{Key: key, Attempts: attempt, Err: err}
			}
		}
	}
}

// retryable reports whether a failed attempt is retried with its key.
func retryable(c codes.Code) bool {
	switch c {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	return false
}

// retryDelay is the delay of st's RetryInfo detail, or 0.
func retryDelay(st *status.Status) time.Duration {
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay().IsValid() {
			return max(0, ri.GetRetryDelay().AsDuration())
		}
	}
	return 0
}

type callKey struct{}

// WithKey returns a context whose calls through UnaryClientInterceptor carry
// key instead of a new one: the key of a call to repeat, kept from a
// *CallError or made when the request was first composed. An idempotency-key
// in the context's outgoing metadata takes precedence.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, callKey{}, key)
}

// withCallKey returns ctx with the call's key in its outgoing metadata, and
// the key.
func withCallKey(ctx context.Context, newKey func() string) (context.Context, string, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	key, err := ParseKey(md)
	switch {
	case err == nil:
		return ctx, key, nil
	case !errors.Is(err, ErrNoKey):
		return ctx, "", status.Error(codes.InvalidArgument, err.Error())
	}
	key, ok := ctx.Value(callKey{}).(string)
	if !ok {
		key = newKey()
	}
	if err := validKey(key); err != nil {
		return ctx, "", status.Error(codes.InvalidArgument, err.Error())
	}
	return metadata.AppendToOutgoingContext(ctx, KeyMetadata, key), key, nil
}

// NewKey returns a fresh key: 128 random bits in hex.
func NewKey() string {
	b := make([]byte, 16)
	_, _ = crand.Read(b)
	return hex.EncodeToString(b)
}

// CallError is the error of a call made through UnaryClientInterceptor: the
// last attempt's error, with the key the call carried. The call may have run
// on the server; calling again later with WithKey(ctx, Key) is safe, and a
// server running the interceptor answers it with the recorded response or
// runs it once. Its text is the error's own, and status.Code and
// status.FromError give the last attempt's status.
type CallError struct {
	// Key is the idempotency key every attempt carried.
	Key string
	// Attempts is how many attempts were made.
	Attempts int
	// Err is the last attempt's error.
	Err error
}

func (e *CallError) Error() string { return e.Err.Error() }

// Unwrap returns the last attempt's error.
func (e *CallError) Unwrap() error { return e.Err }

// GRPCStatus returns the last attempt's status, for status.FromError and
// status.Code.
func (e *CallError) GRPCStatus() *status.Status { return status.Convert(e.Err) }

// KeyOfError returns the key of the call that err (from a call through
// UnaryClientInterceptor) failed, or "" when err carries none.
func KeyOfError(err error) string {
	var ce *CallError
	if errors.As(err, &ce) {
		return ce.Key
	}
	return ""
}
