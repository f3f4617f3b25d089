package idemhttp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// RecordedResponse is a response as Middleware recorded it: what every
// later request with the same key is answered with.
type RecordedResponse struct {
	// Status is the HTTP status code, from 100 to 999.
	Status int
	// Header holds the recorded headers (Config.RecordHeaders, and
	// Content-Encoding), under their canonical names. It is never nil.
	Header http.Header
	// Body is the body as the handler wrote it, encoded as the
	// Content-Encoding header says. It is empty, never nil, when the
	// handler wrote none.
	Body []byte
}

// ErrNotRecordedResponse is the error of DecodeRecordedResponse for bytes
// that are not a response Middleware recorded.
var ErrNotRecordedResponse = errors.New("idemhttp: not a recorded response")

// DecodeRecordedResponse decodes what Middleware stores as a record's
// result (idem.Record.Response, as idem.Lookup returns it), for tools that
// show records, such as the idem command's inspect.
//
// It is strict, so that it tells the middleware's records from results that
// other codecs stored: the data must be the middleware's format throughout,
// with a status from 100 to 999, header names that are canonical HTTP
// tokens, each once, and every length in its shortest form, so that the
// response encodes to exactly as many bytes as data holds. JSON, which the
// default codec stores, never decodes. Anything else returns an error
// matching ErrNotRecordedResponse; nil or empty data among them. The result
// shares no memory with data.
func DecodeRecordedResponse(data []byte) (*RecordedResponse, error) {
	var r response
	if err := (responseCodec{}).Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotRecordedResponse, err)
	}
	if r.Status < 100 || r.Status > 999 {
		return nil, fmt.Errorf("%w: status %d", ErrNotRecordedResponse, r.Status)
	}
	for k := range r.Header {
		if !validHeaderName(k) || http.CanonicalHeaderKey(k) != k {
			return nil, fmt.Errorf("%w: header name %q", ErrNotRecordedResponse, k)
		}
	}
	// Encoded again, the response takes as many bytes unless a header
	// came twice (the map kept one) or a length was padded.
	again, err := responseCodec{}.Marshal(r)
	if err != nil || len(again) != len(data) {
		return nil, fmt.Errorf("%w: a repeated header or a padded length", ErrNotRecordedResponse)
	}
	if r.Body == nil {
		r.Body = []byte{}
	}
	return &RecordedResponse{Status: r.Status, Header: http.Header(r.Header), Body: r.Body}, nil
}

// validHeaderName reports whether s is a token (RFC 9110, section 5.1).
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}
