package main

import (
	"context"
	"fmt"
	"net"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc"
)

// The grpc suite puts the http suite's handler behind gRPC: one unary
// method, /idem.bench.Orders/Place, that inserts one row and answers its
// id, served on loopback TCP by four servers (a bare transaction, the
// handler calling idem.Do with the metadata's key, and behind
// idemgrpc.UnaryServerInterceptor, new keys and one replayed key). Every
// variant's client is the same plain grpc.ClientConn, which sends the key in
// the metadata, so that the ratios measure the servers alone. The messages
// are protobuf's wrappers (Int64Value), so the suite needs no generated
// code.

// placeMethod is the suite's one method.
const placeMethod = "/idem.bench.Orders/Place"

// placeHandler is the method's implementation on a server.
type placeHandler func(ctx context.Context, amount int64) (*wrapperspb.Int64Value, error)

// ordersDesc describes the service by hand, as protoc-gen-go-grpc would.
func ordersDesc() *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "idem.bench.Orders",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Place",
			Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
				in := new(wrapperspb.Int64Value)
				if err := dec(in); err != nil {
					return nil, err
				}
				h := srv.(placeHandler)
				if interceptor == nil {
					return h(ctx, in.Value)
				}
				return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: placeMethod},
					func(ctx context.Context, req any) (any, error) { return h(ctx, req.(*wrapperspb.Int64Value).Value) })
			},
		}},
	}
}

// grpcServer is one server of the suite and the client connection to it.
type grpcServer struct {
	srv  *grpc.Server
	conn *grpc.ClientConn
}

var bareGRPC, doGRPC, idemGRPC *grpcServer

// startGRPC serves h on a free loopback port, behind opts' interceptors.
func startGRPC(h placeHandler, opts ...grpc.ServerOption) (*grpcServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(ordersDesc(), h)
	go func() { _ = srv.Serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		return nil, err
	}
	return &grpcServer{srv: srv, conn: conn}, nil
}

func (s *grpcServer) stop() {
	if s != nil {
		_ = s.conn.Close()
		s.srv.Stop()
	}
}

// place calls the method on s, with key in the metadata unless it is "".
func (s *grpcServer) place(ctx context.Context, key string) error {
	if key != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, idemgrpc.KeyMetadata, key)
	}
	out := new(wrapperspb.Int64Value)
	if err := s.conn.Invoke(ctx, placeMethod, wrapperspb.Int64(999), out); err != nil {
		return err
	}
	if out.Value == 0 {
		return fmt.Errorf("%s: no order id in the answer", placeMethod)
	}
	return nil
}

// grpcReplayKey is the key whose record the replay variant is answered from.
const grpcReplayKey = "the-replayed-grpc-key"

func setupGRPC(ctx context.Context, pool *pgxpool.Pool) (err error) {
	defer func() {
		if err != nil {
			teardownGRPC()
		}
	}()
	// A bare transaction per call.
	bareGRPC, err = startGRPC(func(ctx context.Context, _ int64) (*wrapperspb.Int64Value, error) {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		defer tx.Rollback(ctx) //nolint:errcheck
		id, err := insertRow(ctx, tx)
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return wrapperspb.Int64(id), nil
	})
	if err != nil {
		return err
	}
	// The handler calling idem.Do itself with the metadata's key and the
	// interceptor's defaults (NoWait, a one-minute hold timeout), but no
	// fingerprint or recorded status: the floor under any interceptor.
	doGRPC, err = startGRPC(func(ctx context.Context, _ int64) (*wrapperspb.Int64Value, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		key, err := idemgrpc.ParseKey(md)
		if err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		res, err := idem.Do(ctx, pool, idem.Key{Scope: "bench-grpc-do", ID: key}, func(ctx context.Context, tx pgx.Tx) (int64, error) {
			return insertRow(ctx, tx)
		}, tableOpt, idem.NoWait(), idem.WithHoldTimeout(idemgrpc.DefaultHoldTimeout))
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return wrapperspb.Int64(res.Value), nil
	})
	if err != nil {
		return err
	}
	intercept, err := idemgrpc.UnaryServerInterceptor(idemgrpc.Pgx(pool), idemgrpc.Config{
		Scope:   func(context.Context) (string, error) { return "bench-grpc", nil },
		Options: []idem.DoOption{tableOpt},
	})
	if err != nil {
		return err
	}
	idemGRPC, err = startGRPC(func(ctx context.Context, _ int64) (*wrapperspb.Int64Value, error) {
		id, err := insertRow(ctx, idemgrpc.Tx(ctx))
		if err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return wrapperspb.Int64(id), nil
	}, grpc.UnaryInterceptor(intercept))
	if err != nil {
		return err
	}
	// The replay variant answers every call from this key's record.
	return idemGRPC.place(ctx, grpcReplayKey)
}

func teardownGRPC() {
	for _, s := range []*grpcServer{bareGRPC, doGRPC, idemGRPC} {
		s.stop()
	}
	bareGRPC, doGRPC, idemGRPC = nil, nil, nil
}

// grpcVariants: the method calling idem.Do itself (the baseline: the
// ratio the suite reports is the interceptor's to it), with its own bare
// transaction, and behind the interceptor with a new key per call and with
// one replayed key.
var grpcVariants = []variant{
	{"handler calling Do", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		return doGRPC.place(ctx, key.ID)
	}},
	{"bare handler", func(ctx context.Context, _ *pgxpool.Pool, _ idem.Key) error {
		return bareGRPC.place(ctx, "")
	}},
	{"interceptor", func(ctx context.Context, _ *pgxpool.Pool, key idem.Key) error {
		return idemGRPC.place(ctx, key.ID)
	}},
	{"interceptor, replay", func(ctx context.Context, _ *pgxpool.Pool, _ idem.Key) error {
		return idemGRPC.place(ctx, grpcReplayKey)
	}},
}
