package protocol

import (
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// newToken builds a token for scope as IssueToken does, without recording it.
func newToken(t *testing.T, scope string, random []byte) string {
	t.Helper()
	tag := scopeTag(scope)
	tag = append(tag, checkTag(random, tag)...)
	return base64.RawURLEncoding.EncodeToString(random) + "." + base64.RawURLEncoding.EncodeToString(tag)
}

func TestCheckTokenShape(t *testing.T) {
	random := []byte(strings.Repeat("r", tokenRandomBytes))
	token := newToken(t, "user:1", random)
	require.Len(t, token, 56)
	require.NoError(t, CheckTokenShape(Key{Scope: "user:1", ID: token}))

	// Issued for another scope: told apart by the tag.
	for _, scope := range []string{"user:2", "user:1 ", "User:1", ""} {
		err := CheckTokenShape(Key{Scope: scope, ID: token})
		require.ErrorIs(t, err, ErrTokenOtherScope, scope)
		require.ErrorIs(t, err, ErrTokenRejected, scope)
	}

	// Everything else is unknown, never another scope's.
	unknown := map[string]string{
		"made up":           strings.Repeat("Q", 43) + ".AAAAAAAAAAAA",
		"made up, old size": strings.Repeat("Q", 43) + ".AAAAAAAA",
		"no dot":            strings.Repeat("Q", 56),
		"short random":      token[1:],
		"empty tag":         token[:44],
		"long tag":          token + "A",
		"not base64":        token[:50] + "*" + token[51:],
		"not a token":       "order-17",
		"line breaks":       token[:44] + "AA\r\nAAAA\r\nAA",
	}
	// A one-character typo anywhere.
	for i := range token {
		if token[i] == '.' {
			continue
		}
		c := byte('A')
		if token[i] == 'A' {
			c = 'B'
		}
		unknown[fmt.Sprintf("typo at %d", i)] = token[:i] + string(c) + token[i+1:]
	}
	for name, id := range unknown {
		for _, scope := range []string{"user:1", "user:2"} {
			// Strict decoding refuses a typo in the bits the random
			// part's last character leaves over, so every typo counts.
			err := CheckTokenShape(Key{Scope: scope, ID: id})
			require.ErrorIs(t, err, ErrTokenUnknown, "%s in scope %s", name, scope)
			require.NotErrorIs(t, err, ErrTokenOtherScope, "%s in scope %s", name, scope)
		}
	}
}

// Tokens issued before the check was added (52 bytes: the scope's tag alone)
// are accepted in their scope; anything else about them is unknown.
func TestCheckTokenShapeLegacy(t *testing.T) {
	h := sha256.Sum256([]byte("idem token scope\x00user:1"))
	legacy := strings.Repeat("x", 43) + "." + base64.RawURLEncoding.EncodeToString(h[:6])
	require.Len(t, legacy, 52)
	require.NoError(t, CheckTokenShape(Key{Scope: "user:1", ID: legacy}))
	require.ErrorIs(t, CheckTokenShape(Key{Scope: "user:2", ID: legacy}), ErrTokenUnknown)
	require.ErrorIs(t, CheckTokenShape(Key{Scope: "user:1", ID: legacy[:50] + "zz"}), ErrTokenUnknown)
}
