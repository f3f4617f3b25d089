package idemgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem/idemgrpc"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
)

// orders is the service under test: CreateOrder writes a row through the
// call's transaction and answers as the request says.
type orders struct {
	testpb.UnimplementedOrdersServer
	b          backend
	executions atomic.Int64
	hung       atomic.Bool
}

func (s *orders) CreateOrder(ctx context.Context, req *testpb.CreateOrderRequest) (*testpb.Order, error) {
	s.executions.Add(1)
	if idemgrpc.Tx(ctx) == nil && idemgrpc.SQLTx(ctx) == nil {
		return &testpb.Order{Item: req.Item, Note: "no transaction"}, nil
	}
	id, err := s.b.insert(ctx, req.Item)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "inserting the order: %v", err)
	}
	if req.Panic {
		panic("the handler panicked")
	}
	if req.FailStatement {
		s.b.fail(ctx)
	}
	switch req.Outcome {
	case "", "OK":
	case "HANG_ONCE":
		// The first execution outlives the call's deadline.
		if s.hung.CompareAndSwap(false, true) {
			<-ctx.Done()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	case "PLAIN_ERROR":
		return nil, errors.New("a plain error, not a status")
	default:
		c, ok := codeNamed(req.Outcome)
		if !ok {
			return nil, status.Errorf(codes.Internal, "the test sent the outcome %q", req.Outcome)
		}
		st, err := status.New(c, "the handler answers "+req.Outcome).WithDetails(
			&errdetails.ErrorInfo{Reason: "ORDER_" + req.Outcome, Domain: "shop.test", Metadata: map[string]string{"order": fmt.Sprint(id)}})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	return &testpb.Order{Id: id, Item: req.Item, AmountCents: req.AmountCents, Note: strings.Repeat("n", int(req.NoteBytes))}, nil
}

// codeNamed is the code whose String is name.
func codeNamed(name string) (codes.Code, bool) {
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		if c.String() == name {
			return c, true
		}
	}
	return 0, false
}

func (s *orders) Ping(_ context.Context, req *testpb.PingRequest) (*testpb.PingReply, error) {
	return &testpb.PingReply{Text: req.Text}, nil
}

func (s *orders) Watch(req *testpb.WatchRequest, stream grpc.ServerStreamingServer[testpb.Order]) error {
	for i := range req.Count {
		if err := stream.Send(&testpb.Order{Id: int64(i + 1)}); err != nil {
			return err
		}
	}
	return nil
}

type userKey struct{}

// authenticate stands for the application's authentication: it puts the
// caller named by the metadata x-user in the context.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if u := md.Get("x-user"); len(u) == 1 {
		ctx = context.WithValue(ctx, userKey{}, u[0])
	}
	return handler(ctx, req)
}

// scope is Config.Scope: the authenticated caller.
func scope(ctx context.Context) (string, error) {
	u, _ := ctx.Value(userKey{}).(string)
	if u == "" {
		return "", errors.New("no user")
	}
	return "user:" + u, nil
}

// recoverPanics turns a panic into Internal, as a recovery interceptor
// outside the idempotency interceptor does.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if p := recover(); p != nil {
			resp, err = nil, status.Errorf(codes.Internal, "panic: %v", p)
		}
	}()
	return handler(ctx, req)
}

// harness is a gRPC server on loopback TCP serving orders behind the
// interceptor chain outer..., authenticate, recoverPanics and the
// idempotency interceptor.
type harness struct {
	svc    *orders
	addr   string
	client testpb.OrdersClient // without the client interceptor
}

func start(t *testing.T, b backend, cfg idemgrpc.Config, outer ...grpc.UnaryServerInterceptor) *harness {
	t.Helper()
	if cfg.Scope == nil {
		cfg.Scope = scope
	}
	ic, err := b.intercept(cfg)
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(append(outer, authenticate, recoverPanics, ic)...))
	svc := &orders{b: b}
	testpb.RegisterOrdersServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	h := &harness{svc: svc, addr: ln.Addr().String()}
	h.client = testpb.NewOrdersClient(dial(t, h.addr))
	return h
}

// dial connects to addr with the client interceptors given.
func dial(t *testing.T, addr string, interceptors ...grpc.UnaryClientInterceptor) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(interceptors...))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// as is a context whose calls come from user with key (none when "").
func as(user, key string) context.Context {
	kv := []string{"x-user", user}
	if key != "" {
		kv = append(kv, idemgrpc.KeyMetadata, key)
	}
	return metadata.NewOutgoingContext(context.Background(), metadata.Pairs(kv...))
}

// replayed reports whether header marks a replay.
func replayed(header metadata.MD) bool {
	v := header.Get(idemgrpc.ReplayedMetadata)
	return len(v) == 1 && v[0] == "true"
}

// reasonOf is the idem ErrorInfo reason of err, or "".
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.Domain == idemgrpc.ErrorDomain {
			return ei.Reason
		}
	}
	return ""
}

// cutProxy forwards TCP connections to a server and can cut every
// connection open at once, so that a response in flight is lost.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, target: target, open: map[net.Conn]struct{}{}}
	p.wg.Go(p.serve)
	t.Cleanup(func() {
		ln.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.open[c], p.open[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			p.drop(dst)
			p.drop(src)
		}
		p.wg.Go(func() { pipe(s, c) })
		p.wg.Go(func() { pipe(c, s) })
	}
}

func (p *cutProxy) drop(c net.Conn) {
	p.mu.Lock()
	delete(p.open, c)
	p.mu.Unlock()
	c.Close()
}

// cut closes every open connection, both sides.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.open {
		c.Close()
		delete(p.open, c)
	}
}
