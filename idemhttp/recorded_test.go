package idemhttp

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDecodeRecordedResponse(t *testing.T) {
	t.Parallel()

	in := response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}}, Body: []byte(`{"id":7}`)}
	data, err := responseCodec{}.Marshal(in)
	require.NoError(t, err)
	got, err := DecodeRecordedResponse(data)
	require.NoError(t, err)
	require.Equal(t, &RecordedResponse{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}},
		Body: []byte(`{"id":7}`)}, got)
	data[len(data)-1] = 'X'
	require.Equal(t, byte('}'), got.Body[len(got.Body)-1], "the body is a copy")

	// No headers, no body: both are empty, not nil.
	data, err = responseCodec{}.Marshal(response{Status: 204})
	require.NoError(t, err)
	got, err = DecodeRecordedResponse(data)
	require.NoError(t, err)
	require.Equal(t, 204, got.Status)
	require.NotNil(t, got.Header)
	require.Empty(t, got.Header)
	require.NotNil(t, got.Body)
	require.Empty(t, got.Body)
}

// Only the middleware's format decodes: what another codec stored (JSON,
// the default) and bytes the middleware never writes are refused.
func TestDecodeRecordedResponseRefuses(t *testing.T) {
	t.Parallel()

	for name, data := range map[string][]byte{
		"nil":                      nil,
		"empty":                    {},
		"JSON":                     []byte(`{"status":201,"header":{},"body":""}`),
		"a JSON string":            []byte(`"\u0001"`),
		"another version":          {codecVersion + 1, 0, 200, 0},
		"cut short":                {codecVersion, 0, 200, 1, 1, 'a', 1, 3, 'x'},
		"status under 100":         {codecVersion, 0, 99, 0},
		"status over 999":          {codecVersion, 0x03, 0xe8, 0},
		"no header name":           {codecVersion, 0, 200, 1, 0, 1, 1, 'x'},
		"a space in a header name": {codecVersion, 0, 200, 1, 3, 'A', ' ', 'B', 1, 1, 'x'},
		"a header name not canonical": append([]byte{codecVersion, 0, 200, 1, 12}, append([]byte("content-type"),
			1, 4, 't', 'e', 'x', 't')...),
		"a header twice":        {codecVersion, 0, 200, 2, 1, 'A', 1, 1, 'x', 1, 'A', 1, 1, 'y'},
		"a padded header count": {codecVersion, 0, 200, 0x80, 0x00},
		"a padded length":       {codecVersion, 0, 200, 1, 0x81, 0x00, 'A', 1, 1, 'x'},
	} {
		got, err := DecodeRecordedResponse(data)
		require.ErrorIs(t, err, ErrNotRecordedResponse, name)
		require.Nil(t, got, name)
	}
}
