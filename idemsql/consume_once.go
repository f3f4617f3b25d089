package idemsql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/front"
	"github.com/idemkit/idem/internal/protocol"
)

// ConsumeOnce runs fn for a message at most once per consumer, inside the
// caller's transaction tx, and reports whether fn ran, as idem.ConsumeOnce
// does on pgx.
//
// It inserts (consumer, messageID) into the inbox table with ON CONFLICT DO
// NOTHING, in a savepoint of tx; only the transaction that inserted the row
// runs fn, with tx itself. A redelivered message finds the row and
// ConsumeOnce returns false without running fn: acknowledge it. A delivery
// that meets another delivery of the same message still in flight waits
// for it, then returns false (it committed) or runs fn (it rolled back).
// The caller commits or rolls back tx as usual; fn must not.
//
// When fn returns an error or panics, the row and fn's writes are rolled
// back to the savepoint, tx stays usable, and the error is returned (the
// panic raised again): a redelivery processes the message. consumer and
// messageID follow idem.Key's rules (1..255 bytes of printable UTF-8);
// invalid ones return idem.ErrInvalidKey before any SQL, and a nil tx or fn
// idem.ErrInvalidOption, as does a tx already committed or rolled back.
// Under REPEATABLE READ or SERIALIZABLE a delivery committed after tx's
// snapshot fails with SQLSTATE 40001 (idem.IsRetryable). idem.WithInboxTable
// names the inbox table.
func ConsumeOnce(ctx context.Context, tx *sql.Tx, consumer, messageID string,
	fn func(ctx context.Context, tx *sql.Tx) error, opts ...idem.TableOption) (bool, error) {
	if err := front.ValidateMessage(consumer, messageID); err != nil {
		return false, err
	}
	if tx == nil || fn == nil {
		return false, fmt.Errorf("%w: ConsumeOnce needs a transaction and a function", idem.ErrInvalidOption)
	}
	cfg, err := protocol.NewConfig(dialect, opts)
	if err != nil {
		return false, err
	}
	return protocol.ConsumeOnce(ctx, sqlErrors{}, flavor.NewTx(tx), consumer, messageID, fn, &cfg)
}
