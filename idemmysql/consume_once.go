package idemmysql

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/front"
	"github.com/idemkit/idem/internal/protocol"
)

// ConsumeOnce is idem.ConsumeOnce on MySQL: it runs fn for a message at
// most once per consumer, inside the caller's transaction tx (fn receives
// tx), and reports whether fn ran; a redelivery returns false without
// running fn, and fn's error or panic rolls its writes and the message's
// row back to a savepoint, leaving tx usable.
//
// The inbox row goes in with a plain INSERT, whose duplicate (error 1062)
// rolls back that statement alone; INSERT IGNORE would turn a too-long or
// badly encoded ID into a warning and a truncated ID. consumer and
// messageID are checked before any SQL (1..255 bytes of printable UTF-8).
// A delivery waiting for another of the same message that rolls back may
// be ended by InnoDB with a deadlock: a *TxAbortedError, after which tx is
// gone (roll it back and redeliver).
func ConsumeOnce(ctx context.Context, tx *sql.Tx, consumer, messageID string,
	fn func(ctx context.Context, tx *sql.Tx) error, opts ...idem.TableOption) (bool, error) {
	if err := front.ValidateMessage(consumer, messageID); err != nil {
		return false, err
	}
	if tx == nil || fn == nil {
		return false, fmt.Errorf("%w: ConsumeOnce needs a transaction and a function", idem.ErrInvalidOption)
	}
	d, err := dialectOf(ctx, tx)
	if err != nil {
		return false, closedHandle("ConsumeOnce", err)
	}
	cfg, err := protocol.NewConfig(d, opts)
	if err != nil {
		return false, err
	}
	ran, err := protocol.ConsumeOnce(ctx, mysqlErrors{}, flavor.NewTx(tx), consumer, messageID, fn, &cfg)
	return ran, wrap(err)
}
