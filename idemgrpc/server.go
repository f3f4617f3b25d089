package idemgrpc

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/pgerr"
)

// Config configures UnaryServerInterceptor. Only Scope is required.
type Config struct {
	// Scope returns the owner of the call's keys from the call's context:
	// the authenticated user or tenant, as an authentication interceptor
	// ahead of this one put it there. Keys never match across scopes, so
	// one caller's key can never replay another caller's response. An error
	// answers Unauthenticated with a message that does not repeat the
	// error's text. Required.
	Scope func(ctx context.Context) (string, error)
	// Methods lists the full method names ("/package.Service/Method") the
	// interceptor applies to; other calls pass through untouched. Empty
	// means every unary method of the server.
	Methods []string
	// Optional lets calls without an idempotency-key through, without a
	// transaction (Tx and SQLTx return nil), for gradual rollout. By
	// default the key is required and its absence answers InvalidArgument.
	Optional bool
	// Fingerprint digests a call so that a key reused for another call is
	// refused (FailedPrecondition). It defaults to DefaultFingerprint:
	// SHA-256 over the full method name and the request message's
	// deterministic encoding. An error answers Internal.
	Fingerprint func(fullMethod string, req any) ([]byte, error)
	// RecordCodes lists the error codes that are business outcomes: the
	// handler's transaction commits with the error's status recorded, and
	// every later call with the key gets it again. A response with a code
	// not listed (other than OK, which is always recorded) rolls back and
	// records nothing, so that a retry runs the handler again. It defaults
	// to DefaultRecordCodes; a non-nil empty slice records successes only.
	RecordCodes []codes.Code
	// MaxResponseSize caps what is recorded: the response message's
	// encoding, or a recorded error's status with its details. It defaults
	// to 1 MiB; a larger response answers Internal and nothing is recorded.
	// Responses that are never recorded are not capped.
	MaxResponseSize int
	// Wait makes a call whose key is in flight wait for the first one and
	// get its replay, instead of an immediate Aborted.
	Wait bool
	// RetryAfter is the delay of the google.rpc.RetryInfo detail sent with
	// an Aborted for a key in flight. It defaults to 1s.
	RetryAfter time.Duration
	// TTL is how long a record is kept and replayed. It defaults to 24h.
	TTL time.Duration
	// HoldTimeout bounds how long a call may hold its key while the handler
	// runs (idem.WithHoldTimeout), as idemhttp.Config.HoldTimeout does: a
	// handler that leaves its transaction idle for longer has its session
	// ended by PostgreSQL, which frees the key for a retry, and the hung
	// call answers Unavailable. It defaults to DefaultHoldTimeout; a
	// negative value sets no bound; at most idem.MaxHoldTimeout. On MySQL
	// (the MySQL Driver) there is none, and a positive value is refused.
	HoldTimeout time.Duration
	// Options are passed to idem.Do (idem.WithTable, idem.WithTxOptions,
	// idem.RequireIssued, idem.WithHooks, ...). Responses are stored in a
	// format of the interceptor's own: leave idem.WithCodec out.
	Options []idem.DoOption
}

// DefaultHoldTimeout is Config.HoldTimeout's default: longer than any call
// should take.
const DefaultHoldTimeout = time.Minute

// DefaultRecordCodes are the error codes recorded by default: the answers
// that describe the request or the state of the data, which a retry of the
// same request would get again. The others (Canceled, Unknown,
// DeadlineExceeded, ResourceExhausted, Aborted, Unimplemented, Internal,
// Unavailable, DataLoss, Unauthenticated) roll back and record nothing.
var DefaultRecordCodes = []codes.Code{
	codes.InvalidArgument,
	codes.NotFound,
	codes.AlreadyExists,
	codes.PermissionDenied,
	codes.FailedPrecondition,
	codes.OutOfRange,
}

// ErrorDomain is the domain of the google.rpc.ErrorInfo detail on the
// errors the interceptor answers itself; its Reason is one of the Reason
// constants.
const ErrorDomain = "idem.idemkit.github.io"

// The reasons of the interceptor's own errors, in their ErrorInfo detail.
const (
	// ReasonKeyMissing: a covered call has no key (InvalidArgument).
	ReasonKeyMissing = "IDEMPOTENCY_KEY_MISSING"
	// ReasonKeyInvalid: the key is malformed or repeated (InvalidArgument).
	ReasonKeyInvalid = "IDEMPOTENCY_KEY_INVALID"
	// ReasonKeyReused: the key was first used for another call
	// (FailedPrecondition).
	ReasonKeyReused = "IDEMPOTENCY_KEY_REUSED"
	// ReasonInProgress: a call with the key is still running (Aborted, with
	// RetryInfo).
	ReasonInProgress = "REQUEST_IN_PROGRESS"
	// ReasonTokenRejected: with idem.RequireIssued, the key is not a token
	// issued to this caller, or it expired (InvalidArgument).
	ReasonTokenRejected = "TOKEN_REJECTED"
	// ReasonScopeUnknown: Config.Scope failed (Unauthenticated).
	ReasonScopeUnknown = "SCOPE_UNKNOWN"
	// ReasonScopeInvalid: Config.Scope returned a scope idem cannot use
	// (Internal).
	ReasonScopeInvalid = "SCOPE_INVALID"
	// ReasonFingerprintFailed: the request could not be fingerprinted
	// (Internal).
	ReasonFingerprintFailed = "FINGERPRINT_FAILED"
	// ReasonResponseTooLarge: the response exceeds Config.MaxResponseSize;
	// nothing was recorded (Internal).
	ReasonResponseTooLarge = "RESPONSE_TOO_LARGE"
	// ReasonHandlerTxFailed: a statement of the handler failed, yet it
	// answered OK (Internal).
	ReasonHandlerTxFailed = "HANDLER_TRANSACTION_FAILED"
	// ReasonHoldTimeout: the call held its key longer than
	// Config.HoldTimeout and was rolled back (Unavailable, with RetryInfo).
	ReasonHoldTimeout = "HOLD_TIMEOUT"
	// ReasonOutcomeUnknown: the connection broke while COMMIT was in
	// flight (Unavailable, with RetryInfo).
	ReasonOutcomeUnknown = "OUTCOME_UNKNOWN"
	// ReasonConflict: a serialization failure outlasted idem.Do's retries
	// (Aborted, with RetryInfo).
	ReasonConflict = "TRANSACTION_CONFLICT"
	// ReasonFailed: the key's record holds a failure recorded with
	// idem.Permanent by other code (Internal).
	ReasonFailed = "FAILED"
	// ReasonInternal: any other error, such as an unreachable database
	// (Internal).
	ReasonInternal = "INTERNAL"
)

// recordOverhead is what a record adds to MaxResponseSize: the format's
// version, tags and the message's type name.
const recordOverhead = 64 << 10

// UnaryServerInterceptor returns the idempotency interceptor over the
// database of d: Pgx for pgx (handlers reach the call's transaction with
// Tx), SQL for PostgreSQL through database/sql and MySQL for MySQL and
// MariaDB (SQLTx). Install it with grpc.UnaryInterceptor or, among others,
// grpc.ChainUnaryInterceptor, after the interceptor that authenticates the
// caller. Streaming methods never reach it. It fails, with an error matching
// idem.ErrInvalidOption, when d has no database, Scope is missing, a method
// name is not a full method name, a size or duration is negative
// (HoldTimeout excepted) or HoldTimeout is over idem.MaxHoldTimeout.
func UnaryServerInterceptor[TTx any](d Driver[TTx], cfg Config) (grpc.UnaryServerInterceptor, error) {
	if handle.Missing(d) || cfg.Scope == nil {
		return nil, fmt.Errorf("%w: idemgrpc.UnaryServerInterceptor needs a database and Config.Scope", idem.ErrInvalidOption)
	}
	if cfg.MaxResponseSize < 0 || cfg.RetryAfter < 0 || cfg.TTL < 0 {
		return nil, fmt.Errorf("%w: idemgrpc.Config sizes and durations must not be negative", idem.ErrInvalidOption)
	}
	if cfg.HoldTimeout > idem.MaxHoldTimeout {
		return nil, fmt.Errorf("%w: idemgrpc.Config.HoldTimeout %v is over idem.MaxHoldTimeout (%v)", idem.ErrInvalidOption, cfg.HoldTimeout, idem.MaxHoldTimeout)
	}
	s := &server[TTx]{d: d, cfg: cfg, record: map[codes.Code]bool{codes.OK: true}}
	if len(cfg.Methods) > 0 {
		s.methods = map[string]bool{}
		for _, m := range cfg.Methods {
			if !fullMethod(m) {
				return nil, fmt.Errorf("%w: idemgrpc.Config.Methods: %q is not a full method name such as \"/package.Service/Method\"", idem.ErrInvalidOption, m)
			}
			s.methods[m] = true
		}
	}
	if s.cfg.Fingerprint == nil {
		s.cfg.Fingerprint = DefaultFingerprint
	}
	recordCodes := cfg.RecordCodes
	if recordCodes == nil {
		recordCodes = DefaultRecordCodes
	}
	for _, c := range recordCodes {
		s.record[c] = true
	}
	if s.cfg.MaxResponseSize == 0 {
		s.cfg.MaxResponseSize = 1 << 20
	}
	if s.cfg.RetryAfter == 0 {
		s.cfg.RetryAfter = time.Second
	}
	if _, ok := any(d).(unbounded); ok {
		if cfg.HoldTimeout > 0 {
			return nil, fmt.Errorf("%w: idemgrpc.Config.HoldTimeout is not supported on this database", idem.ErrInvalidOption)
		}
		s.cfg.HoldTimeout = -1
	}
	if s.cfg.HoldTimeout == 0 {
		s.cfg.HoldTimeout = DefaultHoldTimeout
	}
	recordCap := math.MaxInt
	if s.cfg.MaxResponseSize < recordCap-recordOverhead {
		recordCap = s.cfg.MaxResponseSize + recordOverhead
	}
	s.opts = []idem.DoOption{idem.WithMaxResultSize(recordCap)}
	if s.cfg.HoldTimeout > 0 {
		s.opts = append(s.opts, idem.WithHoldTimeout(s.cfg.HoldTimeout))
	}
	s.opts = append(s.opts, cfg.Options...)
	if cfg.TTL > 0 {
		s.opts = append(s.opts, idem.WithTTL(cfg.TTL))
	}
	if !cfg.Wait {
		s.opts = append(s.opts, idem.NoWait())
	}
	return s.intercept, nil
}

// fullMethod reports whether m reads "/service/method".
func fullMethod(m string) bool {
	service, method, ok := strings.Cut(strings.TrimPrefix(m, "/"), "/")
	return strings.HasPrefix(m, "/") && ok && service != "" && method != "" && !strings.Contains(method, "/")
}

// DefaultFingerprint is SHA-256 over the full method name, a NUL byte, and
// the request message's deterministic encoding
// (proto.MarshalOptions{Deterministic: true}): the same key sent with another
// method or another message is refused. Deterministic means stable for one
// build of the server, so equal messages (map entries in any order, say)
// give one fingerprint. It fails for a request that is not a proto.Message.
func DefaultFingerprint(fullMethod string, req any) ([]byte, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("idemgrpc: the request is a %T, not a proto.Message", req)
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: encoding the request: %w", err)
	}
	h := sha256.New()
	h.Write([]byte(fullMethod))
	h.Write([]byte{0})
	h.Write(b)
	return h.Sum(nil), nil
}

type server[TTx any] struct {
	d       Driver[TTx]
	cfg     Config
	opts    []idem.DoOption
	methods map[string]bool // nil: every method
	record  map[codes.Code]bool
}

// run is one execution of the handler.
type run struct {
	resp any
	err  error
}

// notRecorded carries the answer of a handler whose code is not recorded
// out of idem.Do, which rolls the transaction back.
type notRecorded struct{ code codes.Code }

func (e *notRecorded) Error() string {
	return fmt.Sprintf("idemgrpc: code %v is not recorded", e.code)
}

var (
	errTooLarge        = errors.New("idemgrpc: the response exceeds the recording limit")
	errHandlerTxFailed = errors.New("idemgrpc: the handler's transaction failed")
	errNotMessage      = errors.New("idemgrpc: the handler's response is not a proto.Message")
)

func (s *server[TTx]) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if s.methods != nil && !s.methods[info.FullMethod] {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	key, err := ParseKey(md)
	switch {
	case errors.Is(err, ErrNoKey) && s.cfg.Optional:
		return handler(ctx, req)
	case errors.Is(err, ErrNoKey):
		return nil, answer(codes.InvalidArgument, ReasonKeyMissing, "This method needs an idempotency-key in the call's metadata.")
	case err != nil:
		detail := "The idempotency-key is not usable."
		var ke *KeyError
		if errors.As(err, &ke) {
			detail = ke.Detail
		}
		return nil, answer(codes.InvalidArgument, ReasonKeyInvalid, detail)
	}
	scope, err := s.cfg.Scope(ctx)
	if err != nil {
		// The error's text stays on the server: it may describe internals.
		return nil, answer(codes.Unauthenticated, ReasonScopeUnknown, "The caller could not be identified.")
	}
	if err := (idem.Key{Scope: scope, ID: "x"}).Validate(); err != nil {
		return nil, answer(codes.Internal, ReasonScopeInvalid, "The server derived an unusable scope for this caller.")
	}
	fp, err := s.cfg.Fingerprint(info.FullMethod, req)
	if err != nil {
		return nil, answer(codes.Internal, ReasonFingerprintFailed, "The server could not fingerprint the request.")
	}
	ikey := idem.Key{Scope: scope, ID: key, Fingerprint: fp}

	var last *run // this call's latest execution of the handler
	res, err := s.d.Do(ctx, ikey, func(ctx context.Context, tx TTx) ([]byte, error) {
		r := &run{}
		last = r
		r.resp, r.err = handler(context.WithValue(ctx, txKey{}, tx), req)
		st := status.Convert(r.err)
		if !s.record[st.Code()] {
			return nil, &notRecorded{code: st.Code()}
		}
		if s.d.Aborted(tx) {
			// A statement of the handler failed: nothing can commit
			// (database/sql, which cannot tell, fails at the completion
			// instead, with SQLSTATE 25P02, handled below).
			return nil, errHandlerTxFailed
		}
		return s.encode(r.resp, st)
	}, s.opts...)
	if last != nil && (errors.Is(err, errHandlerTxFailed) || pgerr.Code(err) == pgerr.InFailedTx) {
		if last.err != nil {
			// The handler rejected the call after a failed statement (a
			// unique violation answered AlreadyExists, say): its answer is
			// right, and nothing is recorded.
			return last.resp, last.err
		}
		err = errHandlerTxFailed
	}
	var nr *notRecorded
	switch {
	case err == nil && res.Replayed:
		msg, st, err := decodeRecord(res.Value)
		if err != nil {
			return nil, answer(codes.Internal, ReasonInternal, "The recorded response could not be replayed.")
		}
		_ = grpc.SetHeader(ctx, metadata.Pairs(ReplayedMetadata, "true"))
		if st != nil {
			return nil, st.Err()
		}
		return msg, nil
	case err == nil, errors.As(err, &nr):
		// The first answer goes out as the handler gave it.
		return last.resp, last.err
	default:
		return nil, s.failure(ctx, err)
	}
}

// failure is the status of a call that neither ran the handler to an
// answer nor replayed one: what idem.Do's err means to the client.
func (s *server[TTx]) failure(ctx context.Context, err error) error {
	switch {
	case errors.Is(err, errTooLarge), errors.Is(err, idem.ErrResultTooLarge):
		return answer(codes.Internal, ReasonResponseTooLarge,
			fmt.Sprintf("The response exceeds the %d bytes that can be recorded; nothing was recorded.", s.cfg.MaxResponseSize))
	case errors.Is(err, errNotMessage):
		return answer(codes.Internal, ReasonInternal, "The handler's response is not a protobuf message; nothing was recorded.")
	case errors.Is(err, errHandlerTxFailed):
		return answer(codes.Internal, ReasonHandlerTxFailed,
			"A statement of the handler failed, so none of its writes committed, but the handler answered as if it had succeeded; nothing was recorded.")
	case errors.Is(err, idem.ErrInProgress):
		return answer(codes.Aborted, ReasonInProgress,
			"A call with this idempotency-key is still being processed; retry later with the same key.", s.cfg.RetryAfter)
	case errors.Is(err, idem.ErrKeyReused):
		return answer(codes.FailedPrecondition, ReasonKeyReused, "This idempotency-key was used for a different request.")
	case errors.Is(err, idem.ErrTokenRejected):
		return answer(codes.InvalidArgument, ReasonTokenRejected, tokenDetail(err))
	case errors.Is(err, idem.ErrInvalidKey):
		return answer(codes.InvalidArgument, ReasonKeyInvalid, "The idempotency-key is not a usable key: send 1 to 255 printable ASCII characters.")
	case errors.Is(err, idem.ErrHoldTimeout):
		return answer(codes.Unavailable, ReasonHoldTimeout,
			"The call took longer than allowed and was rolled back; retry with the same idempotency-key.", time.Second)
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return answer(codes.Unavailable, ReasonOutcomeUnknown, "The outcome is unknown; retry with the same idempotency-key.", time.Second)
	case idem.IsPermanent(err):
		return answer(codes.Internal, ReasonFailed, err.Error())
	case ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
		return status.FromContextError(ctx.Err()).Err()
	case idem.IsRetryable(err):
		return answer(codes.Aborted, ReasonConflict,
			"The call's transaction conflicted with another and was rolled back; retry with the same idempotency-key.", s.cfg.RetryAfter)
	default:
		return answer(codes.Internal, ReasonInternal, "The call could not be processed.")
	}
}

// encode records a handler's answer, refusing one over MaxResponseSize.
func (s *server[TTx]) encode(resp any, st *status.Status) ([]byte, error) {
	if st.Code() != codes.OK {
		p := st.Proto()
		if proto.Size(p) > s.cfg.MaxResponseSize {
			return nil, errTooLarge
		}
		return encodeStatus(p)
	}
	m, ok := resp.(proto.Message)
	if !ok || m == nil || !m.ProtoReflect().IsValid() {
		return nil, errNotMessage
	}
	if proto.Size(m) > s.cfg.MaxResponseSize {
		return nil, errTooLarge
	}
	return encodeResponse(m)
}

// answer is an error of the interceptor's own: its code and message, an
// ErrorInfo detail with reason, and a RetryInfo detail when retry is given.
func answer(code codes.Code, reason, msg string, retry ...time.Duration) error {
	st := status.New(code, msg)
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: reason, Domain: ErrorDomain}}
	for _, d := range retry {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(d)})
	}
	if with, err := st.WithDetails(details...); err == nil {
		st = with
	}
	return st.Err()
}

// tokenDetail says, for the client's developer, why a token was refused.
func tokenDetail(err error) string {
	switch {
	case errors.Is(err, idem.ErrTokenExpired):
		return "The idempotency-key is a token that has expired: fetch a new one."
	case errors.Is(err, idem.ErrTokenOtherScope):
		return "The idempotency-key is a token issued to another caller: fetch one of your own."
	default:
		return "The idempotency-key is not a token this server issued: fetch one and send it as it was given."
	}
}
