package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
)

// What a record stores (a finished record's response, a failed one's error
// message, a lease's checkpoint data) is shown in one of four forms, its
// format: JSON as it is; a response that idemhttp's middleware recorded,
// decoded into its status, headers and body; other text as it is; other
// bytes as their size and a hex preview.
const (
	formatJSON     = "json"
	formatIdemHTTP = "idemhttp"
	formatText     = "text"
	formatBytes    = "base64" // in --json, the bytes are base64
)

// maxShown is the most bytes of JSON or text printed as they are.
const maxShown = 4096

// hexShown is how many bytes the hex preview of other bytes shows.
const hexShown = 64

// formatOf says how b is shown.
func formatOf(b []byte) (string, *idemhttp.RecordedResponse) {
	if json.Valid(b) {
		return formatJSON, nil
	}
	if resp, err := idemhttp.DecodeRecordedResponse(b); err == nil {
		return formatIdemHTTP, resp
	}
	if isText(b) {
		return formatText, nil
	}
	return formatBytes, nil
}

// writeStored writes the rows of inspect's table that show b under label:
// one row, or, for a response idemhttp recorded, its status, then a row per
// header value and the body, indented.
func writeStored(w io.Writer, label string, b []byte) {
	format, resp := formatOf(b)
	if format != formatIdemHTTP {
		fmt.Fprintf(w, "%s\t%s\n", label, describe(b))
		return
	}
	fmt.Fprintf(w, "%s\t%s (recorded by idemhttp)\n", label, statusLine(resp.Status))
	for _, k := range slices.Sorted(maps.Keys(resp.Header)) {
		for _, v := range resp.Header[k] {
			fmt.Fprintf(w, "  %s\t%s\n", k, oneLine(v))
		}
	}
	fmt.Fprintf(w, "  body\t%s\n", describeBody(resp.Body))
}

// summary is b in a few words, for a column of stuck.
func summary(b []byte) string {
	if format, resp := formatOf(b); format == formatIdemHTTP {
		return fmt.Sprintf("HTTP %d: %s", resp.Status, describeBody(resp.Body))
	}
	return describe(b)
}

// describe renders stored bytes: text (JSON among it) as describeBody
// does, other bytes as their size and a hex preview.
func describe(b []byte) string {
	switch {
	case b == nil:
		return "(none)"
	case isText(b):
		return describeBody(b)
	default:
		return count(len(b), "byte") + ": " + hexPreview(b)
	}
}

// describeBody renders an HTTP body: text as it is (on one line, JSON
// compacted, and cut after maxShown bytes), other bytes as their size and a
// hex preview.
func describeBody(b []byte) string {
	switch {
	case len(b) == 0:
		return "(empty)"
	case !isText(b):
		return count(len(b), "byte") + ", not text: " + hexPreview(b)
	}
	s := string(b)
	var compact bytes.Buffer
	if json.Valid(b) && json.Compact(&compact, b) == nil {
		s = compact.String()
	}
	s = strings.TrimSuffix(strings.TrimSuffix(s, "\n"), "\r")
	cut := len(s) > maxShown
	if cut {
		n := maxShown
		for !utf8.RuneStart(s[n]) {
			n--
		}
		s = s[:n]
	}
	s = oneLine(s)
	if cut {
		s += fmt.Sprintf("... (%s in all)", count(len(b), "byte"))
	}
	return s
}

// isText reports whether b is UTF-8 text: no control characters but tabs
// and line breaks.
func isText(b []byte) bool {
	if !utf8.Valid(b) {
		return false
	}
	return !strings.ContainsFunc(string(b), func(r rune) bool {
		return unicode.IsControl(r) && r != '\t' && r != '\n' && r != '\r'
	})
}

// oneLine returns s quoted, with its escapes, when it holds a tab, a line
// break or another control character, so that it stays on its row.
func oneLine(s string) string {
	if strings.ContainsFunc(s, unicode.IsControl) {
		return strconv.Quote(s)
	}
	return s
}

// hexPreview is the first hexShown bytes of b in hex, followed by "..."
// when there are more.
func hexPreview(b []byte) string {
	s := hex.EncodeToString(b[:min(len(b), hexShown)])
	if len(b) > hexShown {
		s += "..."
	}
	return s
}

// statusLine is "HTTP 201 Created", or "HTTP 299" for a status without a
// name.
func statusLine(status int) string {
	return strings.TrimSpace(fmt.Sprintf("HTTP %d %s", status, http.StatusText(status)))
}

// shorten cuts s to at most n runes, ending in "..." when cut.
func shorten(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-3]) + "..."
}

type recordJSON struct {
	Scope          string     `json:"scope"`
	Key            string     `json:"key"`
	Status         string     `json:"status"`
	Attempt        int32      `json:"attempt"`
	Fingerprint    string     `json:"fingerprint,omitempty"`
	Format         string     `json:"format,omitempty"`
	Response       any        `json:"response,omitempty"`
	LockedUntil    *time.Time `json:"locked_until,omitempty"`
	RecoveryPoint  string     `json:"recovery_point,omitempty"`
	CheckpointData any        `json:"checkpoint_data,omitempty"`
	CreatedAt      time.Time  `json:"created_at"`
	UpdatedAt      time.Time  `json:"updated_at"`
	ExpiresAt      time.Time  `json:"expires_at"`
}

// httpJSON is a response idemhttp recorded, for --json: a body that is
// text is given whole as a string, any other whole in base64, beside its
// first hexShown bytes in hex.
type httpJSON struct {
	Status     int                 `json:"status"`
	Headers    map[string][]string `json:"headers"`
	Body       *string             `json:"body,omitempty"`
	BodySize   int                 `json:"body_size"`
	BodyHex    string              `json:"body_hex_preview,omitempty"`
	BodyBase64 []byte              `json:"body_base64,omitempty"`
}

// jsonRecord is r for --json: the stored bytes are the response of a
// finished record and the checkpoint data of a lease still processing;
// format says how they are given: as JSON when they are JSON ("json"),
// decoded when idemhttp's middleware recorded them ("idemhttp"), else in
// base64 ("base64").
func jsonRecord(r *idem.Record) recordJSON {
	j := recordJSON{Scope: r.Scope, Key: r.ID, Status: r.Status, Attempt: r.Attempt, LockedUntil: r.LockedUntil,
		RecoveryPoint: r.RecoveryPoint, CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, ExpiresAt: r.ExpiresAt}
	if len(r.Fingerprint) > 0 {
		j.Fingerprint = hex.EncodeToString(r.Fingerprint)
	}
	var stored any
	if r.Response != nil {
		var resp *idemhttp.RecordedResponse
		j.Format, resp = formatOf(r.Response)
		switch j.Format {
		case formatJSON:
			stored = json.RawMessage(r.Response)
		case formatIdemHTTP:
			stored = newHTTPJSON(resp)
		case formatText:
			stored = string(r.Response)
		default:
			stored = r.Response // []byte marshals as base64
		}
	}
	if r.Status == idem.StatusProcessing {
		j.CheckpointData = stored
	} else {
		j.Response = stored
	}
	return j
}

func newHTTPJSON(resp *idemhttp.RecordedResponse) httpJSON {
	h := httpJSON{Status: resp.Status, Headers: resp.Header, BodySize: len(resp.Body)}
	if isText(resp.Body) {
		s := string(resp.Body)
		h.Body = &s
	} else {
		h.BodyHex, h.BodyBase64 = hex.EncodeToString(resp.Body[:min(len(resp.Body), hexShown)]), resp.Body
	}
	return h
}
