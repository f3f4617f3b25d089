package idemhttp

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// responseCodec stores a recorded response compactly: status, headers and
// body as length-prefixed fields, instead of JSON with a base64 body.
type responseCodec struct{}

const codecVersion = 1

func (responseCodec) Marshal(v any) ([]byte, error) {
	r, ok := v.(response)
	if !ok {
		return nil, fmt.Errorf("idemhttp: cannot encode %T", v)
	}
	n := 3 + len(r.Body) + 8
	for k, vs := range r.Header {
		n += 4 + len(k)
		for _, s := range vs {
			n += 4 + len(s)
		}
	}
	b := make([]byte, 0, n)
	b = append(b, codecVersion)
	b = binary.BigEndian.AppendUint16(b, uint16(r.Status))
	b = binary.AppendUvarint(b, uint64(len(r.Header)))
	for k, vs := range r.Header {
		b = appendString(b, k)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, s := range vs {
			b = appendString(b, s)
		}
	}
	return append(b, r.Body...), nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

var errCorrupt = errors.New("idemhttp: corrupt recorded response")

func (responseCodec) Unmarshal(data []byte, v any) error {
	r, ok := v.(*response)
	if !ok {
		return fmt.Errorf("idemhttp: cannot decode into %T", v)
	}
	if len(data) < 3 || data[0] != codecVersion {
		return errCorrupt
	}
	r.Status = int(binary.BigEndian.Uint16(data[1:3]))
	data = data[3:]
	count, n := binary.Uvarint(data)
	if n <= 0 || count > uint64(len(data)) {
		return errCorrupt
	}
	data = data[n:]
	r.Header = make(map[string][]string, count)
	readString := func() (string, bool) {
		l, n := binary.Uvarint(data)
		if n <= 0 || l > uint64(len(data)-n) {
			return "", false
		}
		s := string(data[n : n+int(l)])
		data = data[n+int(l):]
		return s, true
	}
	for range count {
		k, ok := readString()
		if !ok {
			return errCorrupt
		}
		nv, n := binary.Uvarint(data)
		if n <= 0 || nv > uint64(len(data)) {
			return errCorrupt
		}
		data = data[n:]
		vs := make([]string, 0, nv)
		for range nv {
			s, ok := readString()
			if !ok {
				return errCorrupt
			}
			vs = append(vs, s)
		}
		r.Header[k] = vs
	}
	r.Body = append([]byte(nil), data...)
	return nil
}
