package idemhttp

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestResponseCodecEdges(t *testing.T) {
	t.Parallel()

	// No headers, no body: the status alone survives.
	data, err := responseCodec{}.Marshal(response{Status: 204})
	require.NoError(t, err)
	require.Equal(t, []byte{codecVersion, 0, 204, 0}, data)
	var r response
	require.NoError(t, responseCodec{}.Unmarshal(data, &r))
	require.Equal(t, 204, r.Status)
	require.Empty(t, r.Header)
	require.Empty(t, r.Body)

	// A header with no values, a value that is empty, a body of any bytes.
	in := response{Status: 200, Header: map[string][]string{"X-Empty": {}, "X-Blank": {""}}, Body: []byte{0, 0xff, '\n'}}
	data, err = responseCodec{}.Marshal(in)
	require.NoError(t, err)
	r = response{}
	require.NoError(t, responseCodec{}.Unmarshal(data, &r))
	require.Equal(t, in.Status, r.Status)
	require.Equal(t, []string{}, r.Header["X-Empty"])
	require.Equal(t, []string{""}, r.Header["X-Blank"])
	require.Equal(t, in.Body, r.Body)

	// The decoded body is a copy.
	data[len(data)-1] = 'X'
	require.Equal(t, byte('\n'), r.Body[2])
}

func TestResponseCodecRefuses(t *testing.T) {
	t.Parallel()

	_, err := responseCodec{}.Marshal("not a response")
	require.ErrorContains(t, err, "cannot encode string")
	require.ErrorContains(t, responseCodec{}.Unmarshal([]byte{codecVersion, 0, 200, 0}, new(string)), "cannot decode into *string")

	for name, data := range map[string][]byte{
		"empty":                     nil,
		"no status":                 {codecVersion, 0},
		"another version":           {codecVersion + 1, 0, 200, 0},
		"no header count":           {codecVersion, 0, 200},
		"more headers than bytes":   {codecVersion, 0, 200, 9},
		"name longer than the rest": {codecVersion, 0, 200, 1, 5, 'a'},
		"no value count":            {codecVersion, 0, 200, 1, 1, 'a'},
		"value cut short":           {codecVersion, 0, 200, 1, 1, 'a', 1, 3, 'x'},
	} {
		var r response
		require.ErrorIs(t, responseCodec{}.Unmarshal(data, &r), errCorrupt, name)
	}
}
