// Command grpc runs a small orders service over gRPC on a real database,
// PostgreSQL or MySQL/MariaDB, with idemgrpc's interceptors on both sides:
// a customer places an order, the network loses the server's response after
// the order and its payment committed, the client interceptor retries with
// the same idempotency key and gets the recorded receipt, and a later repeat
// of the call with the kept key gets it again. It prints what happened and
// checks that the order and its payment were written once.
//
//	DATABASE_URL='postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable' go run ./examples/grpc
//	DATABASE_URL='mysql://root@127.0.0.1:3306/test' go run ./examples/grpc
//
// The server and the client run in this one process, talking gRPC over
// loopback TCP. The service is in orderspb (orders.proto). The example
// keeps its tables and idem's in the schema grpc_example on PostgreSQL, in
// the database grpc_example on MySQL, created if missing; DROP SCHEMA
// grpc_example CASCADE (PostgreSQL) or DROP DATABASE grpc_example (MySQL)
// removes all it made. The SQL that differs between the two databases is in
// store_postgres.go and store_mysql.go.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/examples/grpc/orderspb"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/idemgrpc"
)

// schema holds the example's tables and idem's: the schema of that name on
// PostgreSQL, the database of that name on MySQL.
const schema = "grpc_example"

func main() {
	if err := run(context.Background(), os.Getenv("DATABASE_URL"), schema, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "grpc:", err)
		os.Exit(1)
	}
}

// store is the example's SQL, one implementation per database.
type store interface {
	// setUp applies idem's migrations and creates the orders and payments
	// tables if they are missing (neither has a unique key: a duplicate
	// would show).
	setUp(ctx context.Context) error
	// interceptor is idemgrpc's server interceptor on this database.
	interceptor(cfg idemgrpc.Config) (grpc.UnaryServerInterceptor, error)
	// place writes an order and its payment through the call's
	// transaction (ctx is the handler's).
	place(ctx context.Context, item string, amountCents int64) (orderID, paymentID int64, err error)
	// count counts the orders and payments of item.
	count(ctx context.Context, item string) (orders, payments int, err error)
}

// ordersServer is the service. PlaceOrder runs inside the interceptor's
// transaction: its writes commit with the recorded receipt, or not at all.
type ordersServer struct {
	orderspb.UnimplementedOrdersServer
	st         store
	executions atomic.Int64
}

func (s *ordersServer) PlaceOrder(ctx context.Context, req *orderspb.PlaceOrderRequest) (*orderspb.Receipt, error) {
	if req.AmountCents <= 0 {
		// A business answer: recorded, and replayed to a repeat.
		return nil, status.Error(codes.InvalidArgument, "the amount must be positive")
	}
	s.executions.Add(1)
	orderID, paymentID, err := s.st.place(ctx, req.Item, req.AmountCents)
	if err != nil {
		// Not recorded: the transaction rolls back and a retry runs again.
		return nil, status.Errorf(codes.Unavailable, "placing the order: %v", err)
	}
	return &orderspb.Receipt{OrderId: orderID, PaymentId: paymentID, AmountCents: req.AmountCents, Status: "paid"}, nil
}

type customerKey struct{}

// authenticate stands for the service's authentication: it takes the
// customer from the metadata x-customer. A real service checks a token.
func authenticate(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c := md.Get("x-customer")
	if len(c) != 1 || c[0] == "" {
		return nil, status.Error(codes.Unauthenticated, "who are you?")
	}
	return handler(context.WithValue(ctx, customerKey{}, c[0]), req)
}

// scope is the interceptor's Config.Scope: keys belong to the customer.
func scope(ctx context.Context) (string, error) {
	c, ok := ctx.Value(customerKey{}).(string)
	if !ok {
		return "", errors.New("no customer")
	}
	return "customer:" + c, nil
}

// lossyNetwork plays a network that loses the first response the server
// sends after the transaction committed, as a connection reset on the way
// back would: the client sees Unavailable and cannot tell whether the order
// was placed.
func lossyNetwork(lost *atomic.Bool) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if err == nil && lost.CompareAndSwap(false, true) {
			return nil, status.Error(codes.Unavailable, "connection reset by peer (the response was lost)")
		}
		return resp, err
	}
}

// logAttempts prints each attempt the client interceptor makes.
func logAttempts(out io.Writer) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		md, _ := metadata.FromOutgoingContext(ctx)
		err := invoker(ctx, method, req, reply, cc, opts...)
		fmt.Fprintf(out, "  attempt with key %s: %s\n", short(md.Get(idemgrpc.KeyMetadata)), status.Code(err))
		return err
	}
}

func short(vs []string) string {
	if len(vs) != 1 || len(vs[0]) < 8 {
		return fmt.Sprint(vs)
	}
	return vs[0][:8] + "…"
}

// run serves the orders service on the database at databaseURL, with the
// tables under name (a schema on PostgreSQL, a database on MySQL), places
// an order through a lossy network and prints what happened to out.
func run(ctx context.Context, databaseURL, name string, out io.Writer) error {
	db, err := exampledb.Open(ctx, databaseURL, name, exampledb.Options{})
	if err != nil {
		return err
	}
	defer db.Close()
	var st store = pgStore{db.Pool}
	if db.SQL != nil {
		st = mysqlStore{db.SQL}
	}
	if err := st.setUp(ctx); err != nil {
		return err
	}
	fmt.Fprintln(out, "idem gRPC example: an order placed through a network that loses a response")
	fmt.Fprintln(out, db.Where())

	// The server: authentication, the lossy network, then idempotency.
	idem, err := st.interceptor(idemgrpc.Config{Scope: scope, Methods: []string{orderspb.Orders_PlaceOrder_FullMethodName}})
	if err != nil {
		return err
	}
	var lost atomic.Bool
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(authenticate, lossyNetwork(&lost), idem))
	svc := &ordersServer{st: st}
	orderspb.RegisterOrdersServer(srv, svc)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	// The client: idemgrpc's interceptor keys and retries the call.
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(
			idemgrpc.UnaryClientInterceptor(idemgrpc.ClientConfig{BaseDelay: 50 * time.Millisecond}),
			logAttempts(out)))
	if err != nil {
		return err
	}
	defer conn.Close()
	client := orderspb.NewOrdersClient(conn)

	item := fmt.Sprintf("espresso machine #%d", time.Now().UnixNano())
	req := &orderspb.PlaceOrderRequest{Item: item, AmountCents: 34900}
	// The key is made when the order is composed, and kept with it.
	key := idemgrpc.NewKey()
	callCtx, cancel := context.WithTimeout(idemgrpc.WithKey(metadata.AppendToOutgoingContext(ctx, "x-customer", "alice"), key), 10*time.Second)
	defer cancel()

	fmt.Fprintf(out, "\nalice places an order for %q (%d cents):\n", item, req.AmountCents)
	var header metadata.MD
	first, err := client.PlaceOrder(callCtx, req, grpc.Header(&header))
	if err != nil {
		return fmt.Errorf("placing the order (key %s, retry later with it): %w", idemgrpc.KeyOfError(err), err)
	}
	fmt.Fprintf(out, "  receipt: order %d, payment %d, %s; replayed: %v\n",
		first.OrderId, first.PaymentId, first.Status, header.Get(idemgrpc.ReplayedMetadata))

	fmt.Fprintln(out, "\nthe app restarts and sends the pending order again, with its kept key:")
	var header2 metadata.MD
	again, err := client.PlaceOrder(callCtx, req, grpc.Header(&header2))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "  receipt: order %d, payment %d, %s; replayed: %v\n",
		again.OrderId, again.PaymentId, again.Status, header2.Get(idemgrpc.ReplayedMetadata))

	orders, payments, err := st.count(ctx, item)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nhandler executions: %d\nrows: %d order, %d payment\n", svc.executions.Load(), orders, payments)
	if !lost.Load() || orders != 1 || payments != 1 || svc.executions.Load() != 1 || !proto.Equal(first, again) {
		return fmt.Errorf("FAIL: %d orders, %d payments, %d executions, receipts %v and %v; want one of each and equal receipts",
			orders, payments, svc.executions.Load(), first, again)
	}
	fmt.Fprintln(out, "OK: the order was placed and charged once; every repeat got the first receipt")
	return nil
}
