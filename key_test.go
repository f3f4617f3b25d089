package idem_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
)

func TestKeyDigest(t *testing.T) {
	t.Parallel()

	// "sha256:" and the first 12 hex digits of the SHA-256.
	d := idem.KeyDigest("user:42")
	require.Regexp(t, `^sha256:[0-9a-f]{12}$`, d)
	require.Equal(t, d, idem.KeyDigest("user:42"))
	require.NotEqual(t, d, idem.KeyDigest("user:43"))
	require.Equal(t, "sha256:e3b0c44298fc", idem.KeyDigest("")) // SHA-256 of nothing
}

// slog shows a key's digests, never the key; fmt still shows the key.
func TestKeyLogValue(t *testing.T) {
	t.Parallel()

	var buf bytes.Buffer
	key := idem.Key{Scope: "tenant-9", ID: "pay-secret-123", Fingerprint: []byte("fp")}
	slog.New(slog.NewTextHandler(&buf, nil)).Info("claim", "key", key)
	line := buf.String()
	require.NotContains(t, line, "tenant-9")
	require.NotContains(t, line, "pay-secret-123")
	require.Contains(t, line, "key.scope="+idem.KeyDigest("tenant-9"))
	require.Contains(t, line, "key.id="+idem.KeyDigest("pay-secret-123"))

	require.Contains(t, fmt.Sprintf("%+v", key), "pay-secret-123")
}

// The error names the field and the reason, with the offending byte's
// position, and never the key itself.
func TestInvalidKeyErrorDescribesTheField(t *testing.T) {
	t.Parallel()

	tests := []struct {
		key    idem.Key
		field  string
		reason string
	}{
		{idem.Key{ID: "k"}, "Scope", "is empty"},
		{idem.Key{Scope: "s"}, "ID", "is empty"},
		{idem.Key{Scope: "s", ID: strings.Repeat("k", 300)}, "ID", "is 300 bytes long; the limit is 255"},
		{idem.Key{Scope: "s\xff", ID: "k"}, "Scope", "is not valid UTF-8"},
		{idem.Key{Scope: "s", ID: "secret\x00"}, "ID", "contains NUL (byte 6)"},
		{idem.Key{Scope: "s", ID: "secret\t"}, "ID", "contains control character U+0009 (byte 6)"},
		{idem.Key{Scope: "s", ID: "secret\u2028"}, "ID", "contains non-printable character U+2028 (byte 6)"},
	}
	for _, tt := range tests {
		err := tt.key.Validate()
		var ike *idem.InvalidKeyError
		require.ErrorAs(t, err, &ike)
		require.Equal(t, tt.field, ike.Field)
		require.Equal(t, tt.reason, ike.Reason)
		require.Equal(t, "idem: invalid key: "+tt.field+" "+tt.reason, err.Error())
		require.NotContains(t, err.Error(), "secret")
	}
}
