package idemgrpc

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/idemkit/idem/idemgrpc/internal/testpb"
)

func TestRecordRoundTrip(t *testing.T) {
	order := &testpb.Order{Id: 7, Item: "tea", AmountCents: 350, Note: "two bags"}
	b, err := encodeResponse(order)
	require.NoError(t, err)
	msg, st, err := decodeRecord(b)
	require.NoError(t, err)
	require.Nil(t, st)
	require.True(t, proto.Equal(order, msg), "decoded %v, recorded %v", msg, order)

	// An empty message records no body and comes back empty.
	b, err = encodeResponse(&testpb.PingReply{})
	require.NoError(t, err)
	msg, _, err = decodeRecord(b)
	require.NoError(t, err)
	require.True(t, proto.Equal(&testpb.PingReply{}, msg))

	want, err := status.New(codes.NotFound, "no such item").WithDetails(&errdetails.ErrorInfo{Reason: "ITEM_UNKNOWN", Domain: "shop"})
	require.NoError(t, err)
	b, err = encodeStatus(want.Proto())
	require.NoError(t, err)
	msg, st, err = decodeRecord(b)
	require.NoError(t, err)
	require.Nil(t, msg)
	require.True(t, proto.Equal(want.Proto(), st.Proto()), "decoded %v, recorded %v", st.Proto(), want.Proto())
}

func TestDecodeRecordRefusesOtherBytes(t *testing.T) {
	good, err := encodeResponse(&testpb.Order{Id: 1})
	require.NoError(t, err)
	okStatus, err := encodeStatus(status.New(codes.OK, "").Proto())
	require.NoError(t, err)
	field := func(b []byte, n protowire.Number, v string) []byte {
		b = protowire.AppendTag(b, n, protowire.BytesType)
		return protowire.AppendString(b, v)
	}
	for name, data := range map[string][]byte{
		"nil":              nil,
		"json":             []byte(`{"id":1}`),
		"another version":  append([]byte{2}, good[1:]...),
		"a field twice":    field(good, fieldType, "idemgrpc.test.v1.Order"),
		"an unknown field": field(good, 4, "x"),
		"type and status":  field(good, fieldStatus, ""),
		"truncated":        good[:len(good)-1],
		"an OK status":     okStatus,
		"version alone":    {recordVersion},
	} {
		if _, _, err := decodeRecord(data); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
	// A type this binary does not link in is named in the error.
	_, _, err = decodeRecord(field([]byte{recordVersion}, fieldType, "other.v1.Thing"))
	require.ErrorContains(t, err, `"other.v1.Thing" is not linked into this server`)
}
