package idemgrpc_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
)

// A repeated call is answered from the record: an equal message, marked
// replayed, one row. Another caller's same key is another call.
func TestRepeatedCallReplays(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		h := start(t, b, idemgrpc.Config{})
		req := &testpb.CreateOrderRequest{Item: "replay", AmountCents: 1999, Labels: map[string]string{"a": "1", "b": "2", "c": "3"}}
		var h1, h2 metadata.MD
		first, err := h.client.CreateOrder(as("ann", "k1"), req, grpc.Header(&h1))
		require.NoError(t, err)
		again, err := h.client.CreateOrder(as("ann", "k1"), req, grpc.Header(&h2))
		require.NoError(t, err)
		require.True(t, proto.Equal(first, again), "first %v, replay %v", first, again)
		require.False(t, replayed(h1), "the first answer is marked replayed")
		require.True(t, replayed(h2), "the replay is not marked")
		require.Equal(t, int64(1), h.svc.executions.Load())
		require.Equal(t, 1, b.rows(t, "replay"))

		other, err := h.client.CreateOrder(as("bob", "k1"), req)
		require.NoError(t, err)
		require.NotEqual(t, first.Id, other.Id, "bob got ann's order")
		require.Equal(t, 2, b.rows(t, "replay"))
	})
}

// 100 concurrent calls with one key leave one row. Without Wait the calls
// that find the key in flight get Aborted with RetryInfo, which the client
// interceptor honours; with Wait they wait for the replay.
func TestConcurrentCallsOneKey(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		for _, wait := range []bool{false, true} {
			t.Run(fmt.Sprintf("wait=%v", wait), func(t *testing.T) {
				h := start(t, b, idemgrpc.Config{Wait: wait, RetryAfter: 20 * time.Millisecond})
				var attempts atomic.Int64
				count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					attempts.Add(1)
					err := invoker(ctx, method, req, reply, cc, opts...)
					if status.Code(err) == codes.Aborted {
						require.Equal(t, idemgrpc.ReasonInProgress, reasonOf(err))
					}
					return err
				}
				client := testpb.NewOrdersClient(dial(t, h.addr,
					idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{MaxAttempts: 100, BaseDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond}), count))
				item := fmt.Sprintf("concurrent-%v", wait)
				req := &testpb.CreateOrderRequest{Item: item, AmountCents: 5}
				answers := make([]*testpb.Order, 100)
				errs := make([]error, 100)
				var wg sync.WaitGroup
				for i := range answers {
					wg.Go(func() { answers[i], errs[i] = client.CreateOrder(as("ann", item), req) })
				}
				wg.Wait()
				for i := range answers {
					require.NoError(t, errs[i])
					require.True(t, proto.Equal(answers[0], answers[i]), "answers %v and %v", answers[0], answers[i])
				}
				require.Equal(t, 1, b.rows(t, item))
				require.Equal(t, int64(1), h.svc.executions.Load())
				t.Logf("%s: 100 calls, %d attempts, 1 row", b.name, attempts.Load())
			})
		}
	})
}

// The server's connection is cut once the handler has committed, so its
// response never arrives: the client interceptor retries with the same key
// and gets the recorded response.
func TestResponseLostAfterCommitIsReplayed(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		var p *cutProxy
		var armed atomic.Bool
		armed.Store(true)
		// Outside the idempotency interceptor: it returns after the commit.
		cutAfterCommit := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			resp, err := handler(ctx, req)
			if err == nil && armed.CompareAndSwap(true, false) {
				p.cut()
			}
			return resp, err
		}
		h := start(t, b, idemgrpc.Config{}, cutAfterCommit)
		p = newCutProxy(t, h.addr)
		var attempts atomic.Int64
		count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			attempts.Add(1)
			return invoker(ctx, method, req, reply, cc, opts...)
		}
		client := testpb.NewOrdersClient(dial(t, p.addr(),
			idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{MaxAttempts: 10, BaseDelay: 10 * time.Millisecond}), count))
		var header metadata.MD
		ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-user", "ann"), 20*time.Second)
		defer cancel()
		order, err := client.CreateOrder(ctx, &testpb.CreateOrderRequest{Item: "lost", AmountCents: 700}, grpc.Header(&header))
		require.NoError(t, err)
		require.False(t, armed.Load(), "the connection was never cut")
		require.GreaterOrEqual(t, attempts.Load(), int64(2))
		require.True(t, replayed(header), "the answer after the cut is not the replay")
		require.Equal(t, "lost", order.Item)
		require.Equal(t, int64(1), h.svc.executions.Load())
		require.Equal(t, 1, b.rows(t, "lost"))
	})
}

// The same key with another request is refused without running the handler.
func TestKeyReusedForAnotherRequest(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		h := start(t, b, idemgrpc.Config{})
		_, err := h.client.CreateOrder(as("ann", "k"), &testpb.CreateOrderRequest{Item: "reuse", AmountCents: 1})
		require.NoError(t, err)
		_, err = h.client.CreateOrder(as("ann", "k"), &testpb.CreateOrderRequest{Item: "reuse", AmountCents: 2})
		require.Equal(t, codes.FailedPrecondition, status.Code(err))
		require.Equal(t, idemgrpc.ReasonKeyReused, reasonOf(err))
		require.Equal(t, int64(1), h.svc.executions.Load())
		require.Equal(t, 1, b.rows(t, "reuse"))
	})
}

// The codes of DefaultRecordCodes commit with the handler's writes and are
// replayed, status, message and details equal; a configured list replaces
// them.
func TestRecordedCodes(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		h := start(t, b, idemgrpc.Config{})
		for _, c := range idemgrpc.DefaultRecordCodes {
			item := "recorded-" + c.String()
			req := &testpb.CreateOrderRequest{Item: item, Outcome: c.String()}
			_, err := h.client.CreateOrder(as("ann", item), req)
			require.Equal(t, c, status.Code(err), "%v", err)
			var header metadata.MD
			_, again := h.client.CreateOrder(as("ann", item), req, grpc.Header(&header))
			require.True(t, proto.Equal(status.Convert(err).Proto(), status.Convert(again).Proto()),
				"%v: first %v, replay %v", c, status.Convert(err).Proto(), status.Convert(again).Proto())
			require.True(t, replayed(header), c.String())
			require.Equal(t, 1, b.rows(t, item), "%v rolled back", c)
		}
		require.Equal(t, int64(len(idemgrpc.DefaultRecordCodes)), h.svc.executions.Load())
	})
}

// The other codes, a plain error and a panic roll back and record nothing:
// a retry runs the handler again.
func TestCodesNotRecorded(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		h := start(t, b, idemgrpc.Config{})
		cases := []struct {
			outcome string
			code    codes.Code
			panics  bool
		}{
			{"Unavailable", codes.Unavailable, false},
			{"Internal", codes.Internal, false},
			{"DeadlineExceeded", codes.DeadlineExceeded, false},
			{"ResourceExhausted", codes.ResourceExhausted, false},
			{"Aborted", codes.Aborted, false},
			{"Unknown", codes.Unknown, false},
			{"Unauthenticated", codes.Unauthenticated, false},
			{"Unimplemented", codes.Unimplemented, false},
			{"DataLoss", codes.DataLoss, false},
			{"Canceled", codes.Canceled, false},
			{"PLAIN_ERROR", codes.Unknown, false},
			{"", codes.Internal, true}, // recoverPanics answers Internal
		}
		for _, c := range cases {
			item := fmt.Sprintf("not-recorded-%s-%v", c.outcome, c.panics)
			req := &testpb.CreateOrderRequest{Item: item, Outcome: c.outcome, Panic: c.panics}
			before := h.svc.executions.Load()
			for range 2 {
				_, err := h.client.CreateOrder(as("ann", item), req)
				require.Equal(t, c.code, status.Code(err), "%s: %v", item, err)
			}
			require.Equal(t, before+2, h.svc.executions.Load(), "%s was replayed", item)
			require.Zero(t, b.rows(t, item), "%s committed", item)
		}
		// A panic's key is free: the same key with a well-behaved request
		// (another fingerprint is fine: nothing was recorded) commits.
		_, err := h.client.CreateOrder(as("ann", "not-recorded--true"), &testpb.CreateOrderRequest{Item: "after-panic"})
		require.NoError(t, err)
		require.Equal(t, 1, b.rows(t, "after-panic"))

		// RecordCodes configures the table.
		h = start(t, b, idemgrpc.Config{RecordCodes: []codes.Code{codes.Unavailable}})
		for _, c := range []struct {
			outcome  string
			recorded bool
		}{{"Unavailable", true}, {"NotFound", false}} {
			item := "configured-" + c.outcome
			for range 2 {
				_, _ = h.client.CreateOrder(as("ann", item), &testpb.CreateOrderRequest{Item: item, Outcome: c.outcome})
			}
			want := map[bool]int{true: 1, false: 0}[c.recorded]
			require.Equal(t, want, b.rows(t, item), c.outcome)
		}
		require.Equal(t, int64(3), h.svc.executions.Load())
	})
}

// A call whose deadline passes in the handler rolls back; a retry with the
// key runs it. The client interceptor's AttemptTimeout retries such an
// attempt within the call's deadline.
func TestDeadlines(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		h := start(t, b, idemgrpc.Config{})
		req := &testpb.CreateOrderRequest{Item: "deadline", Outcome: "HANG_ONCE"}
		ctx, cancel := context.WithTimeout(as("ann", "d1"), 300*time.Millisecond)
		defer cancel()
		_, err := h.client.CreateOrder(ctx, req)
		require.Equal(t, codes.DeadlineExceeded, status.Code(err))
		require.Eventually(t, func() bool { return b.rows(t, "deadline") == 0 && h.svc.executions.Load() == 1 }, 5*time.Second, 10*time.Millisecond)
		_, err = h.client.CreateOrder(as("ann", "d1"), req)
		require.NoError(t, err)
		require.Equal(t, 1, b.rows(t, "deadline"))

		h = start(t, b, idemgrpc.Config{})
		client := testpb.NewOrdersClient(dial(t, h.addr, idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{
			AttemptTimeout: 300 * time.Millisecond, BaseDelay: 10 * time.Millisecond})))
		ctx, cancel = context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), "x-user", "ann"), 10*time.Second)
		defer cancel()
		var header metadata.MD
		_, err = client.CreateOrder(ctx, &testpb.CreateOrderRequest{Item: "attempt-timeout", Outcome: "HANG_ONCE"}, grpc.Header(&header))
		require.NoError(t, err)
		require.Equal(t, int64(2), h.svc.executions.Load())
		require.Equal(t, 1, b.rows(t, "attempt-timeout"))
	})
}

// A response over MaxResponseSize is refused and nothing is recorded.
func TestResponseTooLarge(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		h := start(t, b, idemgrpc.Config{MaxResponseSize: 1000})
		_, err := h.client.CreateOrder(as("ann", "big"), &testpb.CreateOrderRequest{Item: "big", NoteBytes: 2000})
		require.Equal(t, codes.Internal, status.Code(err))
		require.Equal(t, idemgrpc.ReasonResponseTooLarge, reasonOf(err))
		require.Zero(t, b.rows(t, "big"))
		_, err = h.client.CreateOrder(as("ann", "small"), &testpb.CreateOrderRequest{Item: "small", NoteBytes: 900})
		require.NoError(t, err)
		require.Equal(t, 1, b.rows(t, "small"))
	})
}

// On PostgreSQL a failed statement aborts the transaction: an OK answer
// after it is Internal, an error answer goes out and nothing is recorded.
func TestFailedStatement(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		if !b.abortsOnError {
			t.Skip("a failed statement leaves a MySQL transaction usable")
		}
		h := start(t, b, idemgrpc.Config{})
		_, err := h.client.CreateOrder(as("ann", "f1"), &testpb.CreateOrderRequest{Item: "failed-ok", FailStatement: true})
		require.Equal(t, codes.Internal, status.Code(err))
		require.Equal(t, idemgrpc.ReasonHandlerTxFailed, reasonOf(err))
		for range 2 {
			_, err = h.client.CreateOrder(as("ann", "f2"), &testpb.CreateOrderRequest{Item: "failed-exists", FailStatement: true, Outcome: "AlreadyExists"})
			require.Equal(t, codes.AlreadyExists, status.Code(err))
		}
		require.Equal(t, int64(3), h.svc.executions.Load())
		require.Zero(t, b.rows(t, "failed-ok")+b.rows(t, "failed-exists"))
	})
}

// The key and the caller are checked before the handler runs; Optional,
// methods not listed and streaming methods pass through.
func TestMetadataAndPassThrough(t *testing.T) {
	b := pgxBackend(t)
	h := start(t, b, idemgrpc.Config{Methods: []string{testpb.Orders_CreateOrder_FullMethodName}})
	req := &testpb.CreateOrderRequest{Item: "meta"}
	for _, c := range []struct {
		ctx    context.Context
		code   codes.Code
		reason string
	}{
		{as("ann", ""), codes.InvalidArgument, idemgrpc.ReasonKeyMissing},
		{metadata.AppendToOutgoingContext(as("ann", "a"), idemgrpc.KeyMetadata, "b"), codes.InvalidArgument, idemgrpc.ReasonKeyInvalid},
		{as("ann", strings.Repeat("k", 256)), codes.InvalidArgument, idemgrpc.ReasonKeyInvalid},
		{as("ann", " padded"), codes.InvalidArgument, idemgrpc.ReasonKeyInvalid},
		{metadata.NewOutgoingContext(context.Background(), metadata.Pairs(idemgrpc.KeyMetadata, "k")), codes.Unauthenticated, idemgrpc.ReasonScopeUnknown},
	} {
		_, err := h.client.CreateOrder(c.ctx, req)
		require.Equal(t, c.code, status.Code(err), "%v", err)
		require.Equal(t, c.reason, reasonOf(err))
	}
	require.Zero(t, h.svc.executions.Load())

	// Ping is not listed, Watch streams: neither needs a key.
	reply, err := h.client.Ping(as("ann", ""), &testpb.PingRequest{Text: "hi"})
	require.NoError(t, err)
	require.Equal(t, "hi", reply.Text)
	stream, err := h.client.Watch(as("ann", ""), &testpb.WatchRequest{Count: 3})
	require.NoError(t, err)
	var got []int64
	for {
		o, err := stream.Recv()
		if err != nil {
			break
		}
		got = append(got, o.Id)
	}
	require.Equal(t, []int64{1, 2, 3}, got)

	// Optional: no key, no transaction, the handler runs.
	h = start(t, b, idemgrpc.Config{Optional: true})
	o, err := h.client.CreateOrder(as("ann", ""), req)
	require.NoError(t, err)
	require.Equal(t, "no transaction", o.Note)
	require.Zero(t, b.rows(t, "meta"))
}

// A duplicate in flight without Wait is Aborted at once with RetryInfo.
func TestInFlightAnswersAborted(t *testing.T) {
	onEach(t, func(t *testing.T, b backend) {
		release := make(chan struct{})
		entered := make(chan struct{}, 1)
		h := start(t, b, idemgrpc.Config{RetryAfter: 3 * time.Second})
		h.svc.b.insert = wrapInsert(b.insert, entered, release)
		done := make(chan error, 1)
		go func() {
			_, err := h.client.CreateOrder(as("ann", "busy"), &testpb.CreateOrderRequest{Item: "busy"})
			done <- err
		}()
		<-entered
		_, err := h.client.CreateOrder(as("ann", "busy"), &testpb.CreateOrderRequest{Item: "busy"})
		close(release)
		require.Equal(t, codes.Aborted, status.Code(err), "%v", err)
		require.Equal(t, idemgrpc.ReasonInProgress, reasonOf(err))
		var delay time.Duration
		for _, d := range status.Convert(err).Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				delay = ri.GetRetryDelay().AsDuration()
			}
		}
		require.Equal(t, 3*time.Second, delay)
		require.NoError(t, <-done)
		require.Equal(t, 1, b.rows(t, "busy"))
	})
}

// wrapInsert makes insert signal entered and wait for release once.
func wrapInsert(insert func(context.Context, string) (int64, error), entered, release chan struct{}) func(context.Context, string) (int64, error) {
	var once sync.Once
	return func(ctx context.Context, item string) (int64, error) {
		id, err := insert(ctx, item)
		once.Do(func() {
			entered <- struct{}{}
			<-release
		})
		return id, err
	}
}
