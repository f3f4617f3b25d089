package idemhttp

import (
	"errors"
	"net/http"
	"strings"
	"testing"
)

func TestParseKey(t *testing.T) {
	for _, c := range []struct {
		values []string
		want   string
		err    error
	}{
		{[]string{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{[]string{`8e03978e-40d5-43e8-bc93-6894a57f9324`}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{[]string{` "a b" `}, "a b", nil},
		{[]string{`"q\"uote\\d"`}, `q"uote\d`, nil},
		{nil, "", ErrNoKey},
		{[]string{`"a"`, `"b"`}, "", ErrRepeatedKey},
		{[]string{`"a", "b"`}, "", ErrRepeatedKey},
		{[]string{`a,b`}, "", ErrRepeatedKey},
		{[]string{`""`}, "", ErrBadKey},
		{[]string{``}, "", ErrBadKey},
		{[]string{`"unterminated`}, "", ErrBadKey},
		{[]string{`"bad\escape"`}, "", ErrBadKey},
		{[]string{"\"tab\there\""}, "", ErrBadKey},
		{[]string{"caf\xc3\xa9"}, "", ErrBadKey},
		{[]string{`"x" trailing`}, "", ErrBadKey},
		{[]string{`has space`}, "", ErrBadKey},
		{[]string{`"` + string(make([]byte, 0)) + `"`}, "", ErrBadKey},
	} {
		h := http.Header{}
		for _, v := range c.values {
			h.Add(HeaderName, v)
		}
		got, err := ParseKey(h)
		if !errors.Is(err, c.err) || got != c.want {
			t.Errorf("%q: got %q, %v; want %q, %v", c.values, got, err, c.want, c.err)
		}
		var ke *KeyError
		if c.err != nil && c.err != ErrNoKey && (!errors.As(err, &ke) || ke.Detail == "" || ke.Err != c.err) {
			t.Errorf("%q: %v is not a *KeyError with a detail", c.values, err)
		}
	}
	long := make([]byte, 256)
	for i := range long {
		long[i] = 'k'
	}
	h := http.Header{HeaderName: {string(long)}}
	if _, err := ParseKey(h); !errors.Is(err, ErrBadKey) {
		t.Errorf("a 256-byte key: %v", err)
	}
}

// FuzzParseKey: parsing never panics, accepted keys are 1..255 printable
// ASCII bytes, and FormatKey round-trips them.
func FuzzParseKey(f *testing.F) {
	for _, s := range []string{`"abc"`, `abc`, `"a\"b"`, `"a\\b"`, `""`, `"a", "b"`, `a,b`, "\"\x00\"", `"x" y`, ` "k" `} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := parseValue(v)
		if err != nil {
			return
		}
		if len(key) == 0 || len(key) > 255 {
			t.Fatalf("accepted a key of %d bytes", len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("accepted byte 0x%02x", key[i])
			}
		}
		again, err := parseValue(FormatKey(key))
		if err != nil || again != key {
			t.Fatalf("round trip of %q: %q, %v", key, again, err)
		}
	})
}

func TestResponseCodecRoundTrip(t *testing.T) {
	in := response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}, "Link": {"<a>", "<b>"}}, Body: []byte(`{"id":1}`)}
	data, err := responseCodec{}.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out response
	if err := (responseCodec{}).Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if out.Status != in.Status || string(out.Body) != string(in.Body) || len(out.Header) != 2 || out.Header["Link"][1] != "<b>" {
		t.Fatalf("round trip: %+v", out)
	}
	for i := range data {
		var r response
		_ = responseCodec{}.Unmarshal(data[:i], &r) // truncated input must not panic
	}
}

// A refused key's detail never quotes the key, which may be a credential.
func TestKeyErrorDetailHidesTheKey(t *testing.T) {
	for _, v := range []string{`"sk_live_unterminated`, `sk_live_has space`, `sk_live_a,b`, `"sk_live_x" tail`,
		`"sk_live_\escape"`, `sk_live_"quote`, "sk_live_caf\xc3\xa9", `"sk_live_a", "b"`} {
		_, err := ParseKey(http.Header{HeaderName: {v}})
		var ke *KeyError
		if !errors.As(err, &ke) {
			t.Fatalf("%q: %v is not a *KeyError", v, err)
		}
		if strings.Contains(ke.Detail, "sk_live") || strings.Contains(err.Error(), "sk_live") {
			t.Errorf("%q: the detail quotes the key: %s", v, ke.Detail)
		}
	}
}

// A detail names no byte of the key, not even the one refused.
func TestKeyErrorDetailNamesNoByte(t *testing.T) {
	_, err := ParseKey(http.Header{HeaderName: {"k\xff"}})
	var ke *KeyError
	if !errors.As(err, &ke) || strings.Contains(ke.Detail, "ff") || !strings.Contains(ke.Detail, "position 2") {
		t.Fatalf("detail %v", err)
	}
}
