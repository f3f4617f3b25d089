package idemgrpc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// fakeServer is an invoker that answers each attempt with the next error of
// answers (nil: success) and notes what the attempt carried.
type fakeServer struct {
	mu       sync.Mutex
	answers  []error
	keys     []string
	at       []time.Time
	deadline []bool
}

func (f *fakeServer) invoke(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, opts ...grpc.CallOption) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	md, _ := metadata.FromOutgoingContext(ctx)
	f.keys = append(f.keys, md.Get(KeyMetadata)...)
	f.at = append(f.at, time.Now())
	_, hasDeadline := ctx.Deadline()
	f.deadline = append(f.deadline, hasDeadline)
	if len(f.answers) == 0 {
		return nil
	}
	err := f.answers[0]
	f.answers = f.answers[1:]
	if err == context.DeadlineExceeded {
		// The attempt outlives its deadline.
		<-ctx.Done()
		return status.FromContextError(ctx.Err()).Err()
	}
	return err
}

func (f *fakeServer) attempts() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.at)
}

const method = "/idemgrpc.test.v1.Orders/CreateOrder"

func call(ctx context.Context, cfg ClientConfig, f *fakeServer) error {
	return UnaryClientInterceptor(cfg)(ctx, method, nil, nil, nil, f.invoke)
}

var fast = ClientConfig{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond}

func TestClientRetriesWithOneKey(t *testing.T) {
	for _, code := range []codes.Code{codes.Unavailable, codes.Aborted, codes.ResourceExhausted} {
		f := &fakeServer{answers: []error{status.Error(code, "busy"), status.Error(code, "busy")}}
		require.NoError(t, call(context.Background(), fast, f), code.String())
		require.Equal(t, 3, f.attempts(), code.String())
		require.Len(t, f.keys, 3)
		require.NotEmpty(t, f.keys[0])
		require.Equal(t, f.keys[0], f.keys[1])
		require.Equal(t, f.keys[0], f.keys[2])
	}
	// Two calls get two keys.
	f := &fakeServer{}
	require.NoError(t, call(context.Background(), fast, f))
	require.NoError(t, call(context.Background(), fast, f))
	require.NotEqual(t, f.keys[0], f.keys[1])
}

func TestClientDoesNotRetryOtherCodes(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.FailedPrecondition, codes.Internal, codes.Unknown,
		codes.NotFound, codes.PermissionDenied, codes.Unauthenticated, codes.Canceled} {
		f := &fakeServer{answers: []error{status.Error(code, "no")}}
		err := call(context.Background(), fast, f)
		require.Equal(t, code, status.Code(err))
		require.Equal(t, 1, f.attempts(), code.String())
	}
}

func TestClientKeys(t *testing.T) {
	// A chosen key.
	f := &fakeServer{}
	require.NoError(t, call(WithKey(context.Background(), "order-42"), fast, f))
	require.Equal(t, []string{"order-42"}, f.keys)
	// A key already in the outgoing metadata wins, and is sent once.
	f = &fakeServer{}
	ctx := metadata.AppendToOutgoingContext(WithKey(context.Background(), "other"), KeyMetadata, "from-md")
	require.NoError(t, call(ctx, fast, f))
	require.Equal(t, []string{"from-md"}, f.keys)
	// NewKey is used when set.
	f = &fakeServer{}
	require.NoError(t, call(context.Background(), ClientConfig{NewKey: func() string { return "made" }}, f))
	require.Equal(t, []string{"made"}, f.keys)
	// An unusable key fails before anything is sent.
	for _, ctx := range []context.Context{
		WithKey(context.Background(), ""),
		WithKey(context.Background(), "caf\xc3\xa9"),
		metadata.AppendToOutgoingContext(context.Background(), KeyMetadata, "a", KeyMetadata, "b"),
	} {
		f = &fakeServer{}
		err := call(ctx, fast, f)
		require.Equal(t, codes.InvalidArgument, status.Code(err))
		require.Zero(t, f.attempts())
	}
	// Methods not listed are called once, without a key.
	f = &fakeServer{answers: []error{status.Error(codes.Unavailable, "down")}}
	err := call(context.Background(), ClientConfig{Methods: []string{"/idemgrpc.test.v1.Orders/Ping"}}, f)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Equal(t, 1, f.attempts())
	require.Empty(t, f.keys)
	require.Empty(t, KeyOfError(err))
}

func TestClientErrorCarriesTheKey(t *testing.T) {
	f := &fakeServer{answers: []error{status.Error(codes.Unavailable, "down"), status.Error(codes.Unavailable, "down"),
		status.Error(codes.Unavailable, "still down")}}
	cfg := fast
	cfg.MaxAttempts = 3
	err := call(context.Background(), cfg, f)
	var ce *CallError
	require.True(t, errors.As(err, &ce))
	require.Equal(t, f.keys[0], ce.Key)
	require.Equal(t, 3, ce.Attempts)
	require.Equal(t, f.keys[0], KeyOfError(err))
	require.Equal(t, codes.Unavailable, status.Code(err))
	st, ok := status.FromError(err)
	require.True(t, ok)
	require.Equal(t, "still down", st.Message())
	require.Equal(t, "rpc error: code = Unavailable desc = still down", err.Error())
	require.Equal(t, 3, f.attempts(), "MaxAttempts bounds the attempts")
}

func TestClientHonoursRetryInfo(t *testing.T) {
	st, err := status.New(codes.Aborted, "in progress").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(150 * time.Millisecond)})
	require.NoError(t, err)
	f := &fakeServer{answers: []error{st.Err()}}
	require.NoError(t, call(context.Background(), fast, f))
	require.Equal(t, 2, f.attempts())
	require.GreaterOrEqual(t, f.at[1].Sub(f.at[0]), 150*time.Millisecond, "the retry came before the server's RetryInfo delay")
}

// A retry that could not start before the call's deadline is not made: the
// call returns the last error, before its deadline.
func TestClientKeepsTheCallsDeadline(t *testing.T) {
	st, err := status.New(codes.Aborted, "in progress").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
	require.NoError(t, err)
	f := &fakeServer{answers: []error{st.Err()}}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err = call(ctx, fast, f)
	require.Equal(t, codes.Aborted, status.Code(err))
	require.Less(t, time.Since(start), time.Second)
	require.Equal(t, 1, f.attempts())
	require.NotEmpty(t, KeyOfError(err))

	// The call's own deadline running out is not retried.
	f = &fakeServer{answers: []error{context.DeadlineExceeded}}
	ctx, cancel = context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = call(ctx, fast, f)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err))
	require.Equal(t, 1, f.attempts())

	// A cancelled call stops waiting at once.
	st, err = status.New(codes.Unavailable, "down").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Hour)})
	require.NoError(t, err)
	f = &fakeServer{answers: []error{st.Err()}}
	ctx, cancel = context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start = time.Now()
	err = call(ctx, fast, f)
	require.Equal(t, codes.Unavailable, status.Code(err))
	require.Less(t, time.Since(start), time.Second)
}

// An attempt that outlives AttemptTimeout is retried within the call's
// deadline.
func TestClientAttemptTimeout(t *testing.T) {
	f := &fakeServer{answers: []error{context.DeadlineExceeded}}
	cfg := fast
	cfg.AttemptTimeout = 50 * time.Millisecond
	require.NoError(t, call(context.Background(), cfg, f))
	require.Equal(t, 2, f.attempts())
	require.Equal(t, []bool{true, true}, f.deadline)
	require.GreaterOrEqual(t, f.at[1].Sub(f.at[0]), 50*time.Millisecond)
}
