package idemhttp

import (
	"bytes"
	"maps"
	"slices"
	"testing"
)

// FuzzResponseCodec feeds the recorded-response decoders arbitrary bytes
// (what they read comes from the database) and round-trips responses built
// from the inputs: decoding never panics, DecodeRecordedResponse accepts only
// what the codec decodes, to the same response, and what is encoded decodes
// to the same response.
func FuzzResponseCodec(f *testing.F) {
	valid, _ := responseCodec{}.Marshal(response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}}, Body: []byte(`{"id":1}`)})
	f.Add(valid, uint16(201), "Content-Type", "application/json", []byte(`{"id":1}`))
	f.Add([]byte{}, uint16(200), "", "", []byte{})
	f.Add([]byte{codecVersion, 0, 200, 0xff, 0xff, 0xff, 0xff, 0x0f}, uint16(404), "Link", "<a>, <b>", []byte("not found"))
	f.Add([]byte{codecVersion, 0x01, 0xf4, 1, 3, 'k', 'e', 'y', 2, 1, 'a'}, uint16(500), "X-\xff", "\x00", []byte{0, 1, 2})
	f.Fuzz(func(t *testing.T, data []byte, status uint16, key, value string, body []byte) {
		var r response
		err := (responseCodec{}).Unmarshal(data, &r)
		if strict, serr := DecodeRecordedResponse(data); serr == nil {
			if err != nil || !sameResponse(r, response{Status: strict.Status, Header: strict.Header, Body: strict.Body}) {
				t.Fatalf("DecodeRecordedResponse accepted %q as %+v; the codec: %+v, %v", data, strict, r, err)
			}
		}
		if err == nil {
			again, err := responseCodec{}.Marshal(r)
			if err != nil {
				t.Fatalf("re-encoding a decoded response: %v", err)
			}
			var r2 response
			if err := (responseCodec{}).Unmarshal(again, &r2); err != nil || !sameResponse(r, r2) {
				t.Fatalf("decode(encode(decode(data))) differs: %+v, %+v, %v", r, r2, err)
			}
		}

		in := response{Status: int(status), Header: map[string][]string{}, Body: body}
		if key != "" {
			in.Header[key] = []string{value, value + "2"}
		}
		enc, err := responseCodec{}.Marshal(in)
		if err != nil {
			t.Fatalf("encoding: %v", err)
		}
		var out response
		if err := (responseCodec{}).Unmarshal(enc, &out); err != nil {
			t.Fatalf("decoding what was encoded: %v", err)
		}
		if !sameResponse(in, out) {
			t.Fatalf("round trip: %+v became %+v", in, out)
		}
	})
}

func sameResponse(a, b response) bool {
	return a.Status == b.Status && bytes.Equal(a.Body, b.Body) &&
		maps.EqualFunc(a.Header, b.Header, func(x, y []string) bool { return slices.Equal(x, y) })
}
