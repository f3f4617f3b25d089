// Package front holds what the database/sql fronts (idemsql, idemmysql)
// share above the protocol: the checks of their arguments in the root
// package's terms.
package front

import (
	"errors"

	"github.com/idemkit/idem"
)

// ValidateMessage checks a ConsumeOnce consumer and message ID as
// idem.ConsumeOnce does: with idem.Key's rules, naming the field that
// failed.
func ValidateMessage(consumer, messageID string) error {
	err := idem.Key{Scope: consumer, ID: messageID}.Validate()
	var invalid *idem.InvalidKeyError
	if !errors.As(err, &invalid) {
		return err
	}
	field := "consumer"
	if invalid.Field == "ID" {
		field = "message ID"
	}
	return &idem.InvalidKeyError{Field: field, Reason: invalid.Reason}
}
