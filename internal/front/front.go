// Package front holds what the database/sql fronts (idemsql, idemmysql)
// share above the protocol: the checks of their arguments in the root
// package's terms.
package front

import (
	"errors"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/protocol"
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

// PurgeParams is po to the protocol, but for its Hooks (PurgeOptions).
func PurgeParams(po idem.PurgeParams) protocol.PurgeParams {
	return protocol.PurgeParams{BatchSize: po.BatchSize, InboxRetention: po.InboxRetention, OnBatch: po.OnBatch,
		OnInboxBatch: po.OnInboxBatch, RowsPerSecond: po.RowsPerSecond, Retry: protocol.Retry(po.Retry)}
}

// PurgeOptions is opts and, when h is set, idem.WithHooks(h): the options
// of a Purge whose PurgeParams.Hooks is h.
func PurgeOptions(h idem.Hooks, opts []idem.TableOption) []idem.KeyOption {
	all := make([]idem.KeyOption, 0, len(opts)+1)
	for _, o := range opts {
		all = append(all, o)
	}
	if h != nil {
		all = append(all, idem.WithHooks(h))
	}
	return all
}
