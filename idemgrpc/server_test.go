package idemgrpc

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemgrpc/internal/testpb"
)

// noDB is a Driver that fails the test if the interceptor reaches the
// database.
type noDB struct{ t *testing.T }

func (d noDB) Do(context.Context, idem.Key, func(context.Context, pgx.Tx) ([]byte, error), ...idem.DoOption) (idem.Result[[]byte], error) {
	d.t.Fatal("the interceptor reached the database")
	return idem.Result[[]byte]{}, nil
}

func (noDB) Aborted(pgx.Tx) bool { return false }

func scopeOK(context.Context) (string, error) { return "user:1", nil }

func TestServerConfigIsValidated(t *testing.T) {
	for name, c := range map[string]struct {
		d   Driver[pgx.Tx]
		cfg Config
	}{
		"no database":        {nil, Config{Scope: scopeOK}},
		"no scope":           {noDB{t}, Config{}},
		"a short method":     {noDB{t}, Config{Scope: scopeOK, Methods: []string{"CreateOrder"}}},
		"a method unrooted":  {noDB{t}, Config{Scope: scopeOK, Methods: []string{"pkg.Svc/Create"}}},
		"a method with more": {noDB{t}, Config{Scope: scopeOK, Methods: []string{"/pkg.Svc/Create/x"}}},
		"a negative size":    {noDB{t}, Config{Scope: scopeOK, MaxResponseSize: -1}},
		"a negative TTL":     {noDB{t}, Config{Scope: scopeOK, TTL: -1}},
		"a hold over max":    {noDB{t}, Config{Scope: scopeOK, HoldTimeout: idem.MaxHoldTimeout + 1}},
	} {
		_, err := UnaryServerInterceptor(c.d, c.cfg)
		require.ErrorIs(t, err, idem.ErrInvalidOption, name)
	}
	_, err := UnaryServerInterceptor(MySQL(nil), Config{Scope: scopeOK})
	require.ErrorIs(t, err, idem.ErrInvalidOption, "a nil MySQL database")
	_, err = UnaryServerInterceptor(Pgx(nil), Config{Scope: scopeOK})
	require.ErrorIs(t, err, idem.ErrInvalidOption, "a nil pgx database")
	_, err = UnaryServerInterceptor[pgx.Tx](noDB{t}, Config{Scope: scopeOK, HoldTimeout: -1, Methods: []string{"/pkg.Svc/Create"}})
	require.NoError(t, err)
}

// reason is the ErrorInfo reason of err's status, or "".
func reason(err error) string {
	for _, d := range status.Convert(err).Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.Domain == ErrorDomain {
			return ei.Reason
		}
	}
	return ""
}

// The answers that need no database: the key and the scope are checked
// first, and methods not covered pass through.
func TestServerAnswersBeforeTheDatabase(t *testing.T) {
	info := &grpc.UnaryServerInfo{FullMethod: "/idemgrpc.test.v1.Orders/CreateOrder"}
	ran := false
	handler := func(ctx context.Context, req any) (any, error) {
		ran = true
		if Tx(ctx) != nil || SQLTx(ctx) != nil {
			t.Error("a call passed through with a transaction")
		}
		return &testpb.Order{}, nil
	}
	in := func(kv ...string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(kv...))
	}
	for _, c := range []struct {
		name   string
		cfg    Config
		ctx    context.Context
		info   *grpc.UnaryServerInfo
		code   codes.Code
		reason string
	}{
		{"no key", Config{}, in(), info, codes.InvalidArgument, ReasonKeyMissing},
		{"no metadata at all", Config{}, context.Background(), info, codes.InvalidArgument, ReasonKeyMissing},
		{"two keys", Config{}, in(KeyMetadata, "a", KeyMetadata, "b"), info, codes.InvalidArgument, ReasonKeyInvalid},
		{"a long key", Config{}, in(KeyMetadata, string(make([]byte, 300))), info, codes.InvalidArgument, ReasonKeyInvalid},
		{"a bad key with Optional", Config{Optional: true}, in(KeyMetadata, " x"), info, codes.InvalidArgument, ReasonKeyInvalid},
		{"no key with Optional", Config{Optional: true}, in(), info, codes.OK, ""},
		{"a method not listed", Config{Methods: []string{"/idemgrpc.test.v1.Orders/Ping"}}, in(), info, codes.OK, ""},
		{"an unknown caller", Config{Scope: func(context.Context) (string, error) { return "", errors.New("token expired at db-7") }},
			in(KeyMetadata, "k"), info, codes.Unauthenticated, ReasonScopeUnknown},
		{"an unusable scope", Config{Scope: func(context.Context) (string, error) { return "", nil }},
			in(KeyMetadata, "k"), info, codes.Internal, ReasonScopeInvalid},
		{"a request that is no message", Config{}, in(KeyMetadata, "k"), info, codes.Internal, ReasonFingerprintFailed},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.cfg.Scope == nil {
				c.cfg.Scope = scopeOK
			}
			ic, err := UnaryServerInterceptor[pgx.Tx](noDB{t}, c.cfg)
			require.NoError(t, err)
			ran = false
			var req any = &testpb.CreateOrderRequest{Item: "tea"}
			if c.reason == ReasonFingerprintFailed {
				req = "not a message"
			}
			_, err = ic(c.ctx, req, c.info, handler)
			require.Equal(t, c.code, status.Code(err), "%v", err)
			require.Equal(t, c.reason, reason(err))
			require.Equal(t, c.code == codes.OK, ran, "the handler ran")
			if c.name == "an unknown caller" {
				require.NotContains(t, err.Error(), "db-7", "the scope's error reached the client")
			}
		})
	}
}

func TestDefaultFingerprint(t *testing.T) {
	const m = "/idemgrpc.test.v1.Orders/CreateOrder"
	labels := map[string]string{}
	for i := range 50 {
		labels[string(rune('a'+i%26))+string(rune('a'+i/26))] = "v"
	}
	a := &testpb.CreateOrderRequest{Item: "tea", AmountCents: 350, Labels: labels}
	first, err := DefaultFingerprint(m, a)
	require.NoError(t, err)
	// The same message, its map built anew, fingerprints the same every
	// time: the encoding is deterministic.
	for range 20 {
		again := map[string]string{}
		for k, v := range labels {
			again[k] = v
		}
		fp, err := DefaultFingerprint(m, &testpb.CreateOrderRequest{Item: "tea", AmountCents: 350, Labels: again})
		require.NoError(t, err)
		require.Equal(t, first, fp)
	}
	other, err := DefaultFingerprint(m, &testpb.CreateOrderRequest{Item: "tea", AmountCents: 351, Labels: labels})
	require.NoError(t, err)
	require.NotEqual(t, first, other, "another message")
	other, err = DefaultFingerprint("/idemgrpc.test.v1.Orders/Ping", a)
	require.NoError(t, err)
	require.NotEqual(t, first, other, "another method")
	_, err = DefaultFingerprint(m, 42)
	require.Error(t, err)
}
