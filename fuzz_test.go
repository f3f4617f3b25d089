package idem

import (
	"github.com/idemkit/idem/internal/protocol"

	"encoding/json"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem/internal/ident"
)

// FuzzKeyValidate: Validate never panics, and accepts exactly the keys
// whose scope and ID are 1..255 bytes of valid UTF-8 made of graphic
// characters.
func FuzzKeyValidate(f *testing.F) {
	for _, s := range [][2]string{{"user:1", "8e03978e"}, {"", "k"}, {"s", "\x00"}, {"s", "a\u200bb"}, {"用户", "订单 42"}, {"s", "\xff"}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, scope, id string) {
		err := Key{Scope: scope, ID: id}.Validate()
		want := acceptable(scope) && acceptable(id)
		if (err == nil) != want {
			t.Fatalf("Validate(%q, %q) = %v, want ok=%v", scope, id, err, want)
		}
	})
}

func acceptable(s string) bool {
	if s == "" || len(s) > MaxKeyLen || !utf8.ValidString(s) {
		return false
	}
	return strings.IndexFunc(s, func(r rune) bool { return !unicode.IsGraphic(r) }) < 0
}

// FuzzCodec: what the default codec stores decodes to the same value, for
// raw bytes, JSON documents and strings.
func FuzzCodec(f *testing.F) {
	for _, s := range []string{"", "plain", `{"a":1}`, "\x00\xff", `"quoted"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		raw, err := protocol.EncodeValue[[]byte](nil, data)
		if err != nil {
			t.Fatal(err)
		}
		back, err := protocol.DecodeValue[[]byte](nil, raw)
		if err != nil || string(back) != string(data) {
			t.Fatalf("[]byte round trip: %q -> %q, %v", data, back, err)
		}
		str := string(data)
		enc, err := protocol.EncodeValue(nil, str)
		if err != nil {
			t.Fatal(err)
		}
		dec, err := protocol.DecodeValue[string](nil, enc)
		if err != nil || (utf8.ValidString(str) && dec != str) {
			t.Fatalf("string round trip: %q -> %q, %v", str, dec, err)
		}
		if !utf8.ValidString(str) && dec != eachInvalidByteReplaced(str) {
			// The default codec's documented behaviour: invalid bytes become U+FFFD.
			t.Fatalf("invalid UTF-8 string: %q -> %q, want each invalid byte as U+FFFD", str, dec)
		}
		if json.Valid(data) {
			rm, err := protocol.EncodeValue(nil, json.RawMessage(data))
			if err != nil {
				t.Fatal(err)
			}
			back, err := protocol.DecodeValue[json.RawMessage](nil, rm)
			if err != nil || string(back) != string(data) {
				t.Fatalf("RawMessage round trip: %q -> %q, %v", data, back, err)
			}
		}
	})
}

// FuzzStateMachineConfig: NewStateMachine never panics; what it accepts has
// plain identifiers only, and every transition it allows was configured.
func FuzzStateMachineConfig(f *testing.F) {
	f.Add("orders", "id", "status", "PENDING,PAID", "PENDING>PAID")
	f.Add(`x"; DROP TABLE y; --`, "id", "s", "A,B", "A>B")
	f.Add("t", "id", "s", "A,A", "A>A")
	f.Fuzz(func(t *testing.T, table, idCol, stateCol, states, transitions string) {
		cfg := StateMachineConfig{Table: table, IDColumn: idCol, StateColumn: stateCol,
			States: strings.Split(states, ","), Transitions: map[string][]string{}}
		for _, tr := range strings.Split(transitions, ";") {
			from, to, ok := strings.Cut(tr, ">")
			if ok {
				cfg.Transitions[from] = append(cfg.Transitions[from], to)
			}
		}
		m, err := NewStateMachine(cfg)
		if err != nil {
			return
		}
		for _, n := range []string{table, idCol, stateCol} {
			if !ident.Plain(n, 63) {
				t.Fatalf("accepted identifier %q", n)
			}
		}
		for to, froms := range m.from {
			for _, from := range froms {
				if !strings.Contains(","+strings.Join(cfg.Transitions[from], ",")+",", ","+to+",") {
					t.Fatalf("allows %s -> %s, not configured", from, to)
				}
			}
		}
		_ = m.Mermaid()
	})
}

// eachInvalidByteReplaced is s with every byte that is not part of valid
// UTF-8 replaced by U+FFFD, as encoding/json does.
func eachInvalidByteReplaced(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
