package idem

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/internal/handle"
	"github.com/idemkit/idem/internal/protocol"
)

// DefaultInboxTable is the consume-once table's name unless WithInboxTable
// says otherwise. migrations.Up creates it.
const DefaultInboxTable = protocol.DefaultInboxTable

// ConsumeOnce runs fn for a message at most once per consumer, inside the
// caller's transaction tx, and reports whether fn ran.
//
// It inserts (consumer, messageID) into the inbox table with ON CONFLICT DO
// NOTHING, in a savepoint; only the transaction that inserted the row runs
// fn. A redelivered message finds the row and ConsumeOnce returns false
// without running fn: acknowledge it. A delivery that meets another
// delivery of the same message still in flight waits for it, then returns
// false (it committed) or runs fn (it rolled back).
//
// When fn returns an error or panics, the row and fn's writes are rolled back
// to the savepoint, tx stays usable, and the error is returned (the panic
// re-raised): a redelivery processes the message. consumer and messageID
// follow Key's rules (1..255 bytes of printable UTF-8); invalid ones return
// ErrInvalidKey before any SQL. Under REPEATABLE READ or SERIALIZABLE a
// delivery committed after tx's snapshot fails with SQLSTATE 40001.
func ConsumeOnce(ctx context.Context, tx pgx.Tx, consumer, messageID string,
	fn func(ctx context.Context, tx pgx.Tx) error, opts ...TableOption) (_ bool, err error) {
	if err := validatePart("consumer", consumer); err != nil {
		return false, err
	}
	if err := validatePart("message ID", messageID); err != nil {
		return false, err
	}
	if handle.Missing(tx) || fn == nil {
		return false, fmt.Errorf("%w: ConsumeOnce needs a transaction and a function", ErrInvalidOption)
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return false, err
	}
	return protocol.ConsumeOnce(ctx, pgxErrors{}, pgxTx{tx: tx}, consumer, messageID, fn, &cfg)
}
