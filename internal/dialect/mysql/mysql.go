// Package mysql is the MySQL and MariaDB dialect of the protocol: the
// statements of the record table and the inbox, the bound of a claim's wait,
// and the classification of the servers' errors.
//
// Every decision comes from a locking read: the claim is an INSERT ... ON
// DUPLICATE KEY UPDATE that leaves the key's row locked, and its answer (the
// key's claim token and record) is read under that lock, by the statement
// itself where the server allows RETURNING (MariaDB) and by a SELECT ... FOR
// UPDATE after it elsewhere (MySQL 8). A plain SELECT would read the
// REPEATABLE READ snapshot, which predates the winner's commit; rows
// affected would lie under clientFoundRows. Times are DATETIME(6) compared
// with UTC_TIMESTAMP(6), whatever the session's time_zone.
package mysql

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/internal/protocol"
)

// Server is what the dialect may use of a server.
type Server struct {
	// Returning: INSERT ... RETURNING (MariaDB 10.5 and later). Without
	// it the claim's answer is a SELECT ... FOR UPDATE of its own.
	Returning bool
	// SetStatement: SET STATEMENT ... FOR (MariaDB), which bounds one
	// statement's lock wait on the server. Without it no-wait claims are
	// refused, and a claim's wait is bounded by the server's
	// innodb_lock_wait_timeout alone.
	SetStatement bool
	// SessionBounds: idle_transaction_timeout and max_statement_time
	// (MariaDB 10.3 and later), with which the hold timeout bounds Do's
	// transactions. Without it WithHoldTimeout is refused.
	SessionBounds bool
}

// The servers' dialects.
var (
	MariaDB = New(Server{Returning: true, SetStatement: true, SessionBounds: true})
	// MySQL8 is MySQL 8.0 and later: no RETURNING, no SET STATEMENT.
	MySQL8 = New(Server{})
)

// New returns the dialect of a server that has what s says.
func New(s Server) *protocol.Dialect {
	d := &protocol.Dialect{
		Name:    "MySQL",
		Records: func(t protocol.Table) *protocol.Queries { return records(t, s) },
		Inbox:   inbox,
		Machine: machine,
		Statements: protocol.Statements{
			OneAtATime: true,
		},
		SQLErrors: protocol.SQLErrors{
			Unique:       func(err error) bool { return Number(err) == ErDupEntry },
			IdleTimeout:  func(error) bool { return false },
			MissingTable: missingTable,
			Aborted:      Aborted,
		},
	}
	if s.Returning {
		d.Name = "MariaDB"
	}
	if s.SetStatement {
		d.ClaimPrefix = claimPrefix
	}
	if s.SessionBounds {
		d.HoldSet, d.HoldSession = holdSet, holdSession
	}
	return d
}

// The server errors the protocol acts on.
const (
	ErDupEntry         = 1062 // a duplicate key
	ErNoSuchTable      = 1146
	ErLockWaitTimeout  = 1205 // the statement alone is rolled back
	ErLockDeadlock     = 1213 // the whole transaction is rolled back
	ErCheckRead        = 1020 // "record has changed since last read": the whole transaction
	ErStatementTimeout = 1969 // max_statement_time exceeded: the statement alone
	ErNoWait           = 3572 // MySQL 8's NOWAIT: the statement alone
)

// Number is the server's error number of err, or 0.
func Number(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// Aborted reports an error with which the server rolled the whole
// transaction back: a deadlock, or MariaDB's snapshot isolation conflict.
func Aborted(err error) bool {
	n := Number(err)
	return n == ErLockDeadlock || n == ErCheckRead
}

// missingTable: Table 'db.name' doesn't exist (1146), where db is the
// schema or the current database.
func missingTable(err error, t protocol.Table) bool {
	if Number(err) != ErNoSuchTable {
		return false
	}
	msg := err.Error()
	if t.Schema != "" {
		return strings.Contains(msg, "'"+t.Schema+"."+t.Name+"'")
	}
	return strings.Contains(msg, "."+t.Name+"'")
}

// serverGrace is how much longer than ctx's deadline the server lets a
// claim wait.
const serverGrace = 100 * time.Millisecond

// claimPrefix bounds a claim's lock wait on the server: none for a no-wait
// claim, and at most wait for one whose ctx has a deadline. The client's
// ctx only closes its socket; without the bound the server would keep the
// statement waiting (innodb_lock_wait_timeout, 50s by default).
func claimPrefix(noWait bool, wait time.Duration) string {
	var sets []string
	if noWait {
		sets = append(sets, "innodb_lock_wait_timeout = 0")
	}
	if wait >= 0 {
		// In seconds (0 would mean no bound), a little past the deadline:
		// the client gives up first and reports ctx's error, and the
		// server ends the statement just after.
		sets = append(sets, fmt.Sprintf("max_statement_time = %.3f", (wait+serverGrace).Seconds()))
	}
	if len(sets) == 0 {
		return ""
	}
	return "SET STATEMENT " + strings.Join(sets, ", ") + " FOR "
}

// holdSet lowers the session's idle_transaction_timeout (whole seconds,
// rounded up) and max_statement_time (seconds) to $1 milliseconds, keeping
// a value already lower (0 means none), and keeps the values it replaced in
// user variables for holdSession. The settings are the session's, not the
// transaction's: they outlive COMMIT, and holdSession must run after it.
const holdSet = `SET @idem_hold_idle = @@SESSION.idle_transaction_timeout, @idem_hold_stmt = @@SESSION.max_statement_time,
	SESSION idle_transaction_timeout = IF(@@SESSION.idle_transaction_timeout = 0 OR @@SESSION.idle_transaction_timeout > CEIL($1 / 1000), CEIL($1 / 1000), @@SESSION.idle_transaction_timeout),
	SESSION max_statement_time = IF(@@SESSION.max_statement_time = 0 OR @@SESSION.max_statement_time > $1 / 1000, $1 / 1000, @@SESSION.max_statement_time)`

// holdSession puts back what holdSet replaced, if it ran, and forgets it.
const holdSession = `SET SESSION idle_transaction_timeout = IFNULL(@idem_hold_idle, @@SESSION.idle_transaction_timeout),
	SESSION max_statement_time = IFNULL(@idem_hold_stmt, @@SESSION.max_statement_time),
	@idem_hold_idle = NULL, @idem_hold_stmt = NULL`

// Quote returns t's quoted, possibly database-qualified name. Its names are
// plain identifiers (the options validate them), so backticks are safe.
func Quote(t protocol.Table) string {
	if t.Schema == "" {
		return "`" + t.Name + "`"
	}
	return "`" + t.Schema + "`.`" + t.Name + "`"
}

const now = `UTC_TIMESTAMP(6)`

// purgeable is the condition of a record Purge deletes: expired, and not a
// lease-mode record still processing (its next claim takes it over, so that
// the fencing token never restarts at 1).
const purgeable = `expires_at <= ` + now + ` AND NOT (status = 'processing' AND locked_until IS NOT NULL)`

// leaseTakeable: the record expired, is an unclaimed token, or is a
// processing record of the same request whose lease ran out. A live lease
// is never taken over, whatever the record's expiry says. It reads the old
// row and the new values (VALUES).
const leaseTakeable = `((locked_until IS NULL OR locked_until <= ` + now + `)
	AND (expires_at <= ` + now + ` OR status = 'issued'
		OR (status = 'processing' AND fingerprint = VALUES(fingerprint))))`

// stuckLease is the condition of a lease-mode record still processing whose
// lease ran out.
const stuckLease = `status = 'processing' AND locked_until <= ` + now

// inspectColumns are what Lookup and Stuck read, in the order of
// protocol.StoredRecord's scan; the times as text in UTC.
const inspectColumns = `scope, idem_key, status, attempt, fingerprint, response, locked_until,
	COALESCE(recovery_point, ''), created_at, updated_at, expires_at`

// schemaOf is the SQL of t's database: its own, or the current one. Its
// names are plain identifiers, so they are safe as literals.
func schemaOf(t protocol.Table) string {
	if t.Schema == "" {
		return "DATABASE()"
	}
	return "'" + t.Schema + "'"
}

// recordColumns are what a record read yields, in the order of
// protocol.Record.Dest.
const recordColumns = `attempt, status, fingerprint, response,
	expires_at <= ` + now + `,
	locked_until IS NOT NULL,
	COALESCE(locked_until > ` + now + `, FALSE)`

func records(table protocol.Table, s Server) *protocol.Queries {
	t := Quote(table)
	const ttl = now + ` + INTERVAL $4 MICROSECOND`
	// MySQL assigns left to right with the new values: attempt, which
	// reads status, comes before status changes.
	const takeoverSet = `attempt = CASE WHEN status = 'issued' THEN 1 ELSE attempt + 1 END,
	status = 'processing', fingerprint = $3, response = NULL, locked_until = NULL, recovery_point = NULL,
	created_at = ` + now + `, updated_at = ` + now + `, expires_at = ` + ttl
	const takeable = `((locked_until IS NULL OR locked_until <= ` + now + `)
	AND (expires_at <= ` + now + ` OR status IN ('issued', 'processing')))`
	purge := `DELETE FROM ` + t + ` WHERE ` + purgeable + ` ORDER BY expires_at, scope, idem_key LIMIT $1`
	q := &protocol.Queries{
		Table:  t,
		Tokens: true,
		// The claim inserts the record or, for a key that has one, changes
		// nothing but takes the row's exclusive lock (waiting for an
		// uncommitted holder): the answer is then read under that lock.
		Claim: `INSERT INTO ` + t + ` (scope, idem_key, fingerprint, status, attempt, claim_token, created_at, updated_at, expires_at)
	VALUES ($1, $2, $3, 'processing', 1, $5, ` + now + `, ` + now + `, ` + ttl + `)
	ON DUPLICATE KEY UPDATE attempt = attempt`,
		ClaimRead: `SELECT claim_token, ` + recordColumns + ` FROM ` + t + ` WHERE scope = $1 AND idem_key = $2 FOR UPDATE`,

		ClaimIssued: `UPDATE ` + t + ` SET ` + takeoverSet + `, claim_token = $5
	WHERE scope = $1 AND idem_key = $2 AND status = 'issued' AND expires_at > ` + now,

		Takeover: `UPDATE ` + t + ` SET ` + takeoverSet + `, claim_token = $6
	WHERE scope = $1 AND idem_key = $2 AND attempt = $5 AND ` + takeable,

		Read: `SELECT ` + recordColumns + ` FROM ` + t + ` WHERE scope = $1 AND idem_key = $2 FOR UPDATE`,

		// Lease mode. The claim inserts a processing record with a lease,
		// or takes over one whose lease ran out, inside the upsert (a
		// takeover after a read would upgrade a lock and deadlock): MySQL
		// assigns left to right with the new values, so claim_token goes
		// first, decided from the old row, and every later column follows
		// from whether it now holds the call's token. A takeover of a
		// lease on the same request keeps its checkpoint; an expired
		// record or a token starts afresh. LeaseRead then reads the answer
		// under the row lock.
		LeaseClaim: `INSERT INTO ` + t + ` (scope, idem_key, fingerprint, status, attempt, claim_token, locked_until, created_at, updated_at, expires_at)
	VALUES ($1, $2, $3, 'processing', 1, $6, ` + now + ` + INTERVAL $5 MICROSECOND, ` + now + `, ` + now + `, ` + ttl + `)
	ON DUPLICATE KEY UPDATE
	claim_token = IF(` + leaseTakeable + `, VALUES(claim_token), claim_token),
	recovery_point = IF(claim_token = VALUES(claim_token), IF(status = 'processing' AND expires_at > ` + now + `, recovery_point, NULL), recovery_point),
	response = IF(claim_token = VALUES(claim_token), IF(status = 'processing' AND expires_at > ` + now + `, response, NULL), response),
	attempt = IF(claim_token = VALUES(claim_token), IF(status = 'issued', 1, attempt + 1), attempt),
	status = IF(claim_token = VALUES(claim_token), 'processing', status),
	fingerprint = IF(claim_token = VALUES(claim_token), VALUES(fingerprint), fingerprint),
	locked_until = IF(claim_token = VALUES(claim_token), VALUES(locked_until), locked_until),
	updated_at = IF(claim_token = VALUES(claim_token), VALUES(updated_at), updated_at),
	expires_at = IF(claim_token = VALUES(claim_token), VALUES(expires_at), expires_at)`,
		LeaseClaimIssued: `UPDATE ` + t + ` SET
	recovery_point = IF(status = 'processing' AND expires_at > ` + now + `, recovery_point, NULL),
	response = IF(status = 'processing' AND expires_at > ` + now + `, response, NULL),
	attempt = IF(status = 'issued', 1, attempt + 1),
	status = 'processing', fingerprint = $3, claim_token = $6,
	locked_until = ` + now + ` + INTERVAL $5 MICROSECOND, updated_at = ` + now + `, expires_at = ` + ttl + `
	WHERE scope = $1 AND idem_key = $2 AND status <> 'succeeded' AND status <> 'failed'
		AND expires_at > ` + now + ` AND ` + strings.ReplaceAll(leaseTakeable, "VALUES(fingerprint)", "$3"),
		LeaseRead: `SELECT claim_token, attempt, COALESCE(recovery_point, ''), response FROM ` + t + `
	WHERE scope = $1 AND idem_key = $2 FOR UPDATE`,

		// The record outlives its lease: expires_at never falls before
		// locked_until, nor a finished record's before its TTL. Each
		// statement changes the row, so its count is 1 whatever
		// clientFoundRows says.
		LeaseUpdate: `UPDATE ` + t + ` SET locked_until = ` + now + ` + INTERVAL $4 MICROSECOND, updated_at = ` + now + `,
	expires_at = GREATEST(expires_at, ` + now + ` + INTERVAL $4 MICROSECOND)
	WHERE scope = $1 AND idem_key = $2 AND status = 'processing' AND attempt = $3`,
		LeaseCheckpoint: `UPDATE ` + t + ` SET recovery_point = $4, response = $5, updated_at = ` + now + `,
	locked_until = ` + now + ` + INTERVAL $6 MICROSECOND,
	expires_at = GREATEST(expires_at, ` + now + ` + INTERVAL $6 MICROSECOND)
	WHERE scope = $1 AND idem_key = $2 AND status = 'processing' AND attempt = $3`,
		LeaseFinish: `UPDATE ` + t + ` SET status = $4, response = $5, locked_until = NULL, recovery_point = NULL, updated_at = ` + now + `,
	expires_at = GREATEST(expires_at, ` + now + ` + INTERVAL $6 MICROSECOND)
	WHERE scope = $1 AND idem_key = $2 AND status = 'processing' AND attempt = $3`,
		LeaseRelease: `UPDATE ` + t + ` SET locked_until = ` + now + ` - INTERVAL 1 MICROSECOND, updated_at = ` + now + `
	WHERE scope = $1 AND idem_key = $2 AND status = 'processing' AND attempt = $3`,

		// A token no claim holds yet: no fingerprint, attempt 0, a claim
		// token of zeros (no claim's random one is).
		Issue: `INSERT INTO ` + t + ` (scope, idem_key, fingerprint, status, attempt, claim_token, created_at, updated_at, expires_at)
	VALUES ($1, $2, '', 'issued', 0, UNHEX('00000000000000000000000000000000'), ` + now + `, ` + now + `, ` + now + ` + INTERVAL $3 MICROSECOND)`,

		// Complete always changes status, so its row count is 1 whatever
		// clientFoundRows says; the driver checks it before COMMIT.
		Complete: `UPDATE ` + t + ` SET status = $3, response = $4, updated_at = ` + now + `
	WHERE scope = $1 AND idem_key = $2 AND status = 'processing' AND attempt = $5`,
		CompleteRows: true,

		Release: `DELETE FROM ` + t + ` WHERE scope = $1 AND idem_key = $2 AND status = 'processing' AND attempt = $3`,

		// A batch is one DELETE, in an order that names each row (so that
		// a statement-based binlog replays it alike); it waits for a row
		// another transaction holds (MySQL's DELETE cannot skip one).
		Purge:           purge,
		PurgeSkipLocked: purge,
		CountExpired:    `SELECT COUNT(*) FROM ` + t + ` WHERE ` + purgeable,

		TimeText: true,
		Lookup:   `SELECT ` + inspectColumns + ` FROM ` + t + ` WHERE scope = $1 AND idem_key = $2`,
		Stuck: `SELECT ` + inspectColumns + ` FROM ` + t + ` WHERE ` + stuckLease + `
	ORDER BY locked_until LIMIT $1`,
		// One statement, one snapshot: a row per status (one of NULLs for
		// an empty table, hence the outer join), each with the sizes
		// InnoDB estimates for the table and its secondary indexes.
		Stats: `SELECT s.status, COALESCE(s.n, 0), COALESCE(s.expired, 0), COALESCE(s.stuck, 0), s.oldest,
		COALESCE(z.data_length, 0), COALESCE(z.index_length, 0)
	FROM (SELECT 1 AS one) AS o
	LEFT JOIN (SELECT status, COUNT(*) AS n, SUM(` + purgeable + `) AS expired, SUM(` + stuckLease + `) AS stuck,
		MIN(created_at) AS oldest FROM ` + t + ` GROUP BY status) AS s ON TRUE
	LEFT JOIN information_schema.TABLES AS z
		ON z.table_schema = ` + schemaOf(table) + ` AND z.table_name = '` + table.Name + `'`,
	}
	if s.Returning {
		q.Claim += `
	RETURNING claim_token, ` + recordColumns
		q.ClaimReturns = true
	}
	return q
}

func inbox(table protocol.Table) *protocol.InboxQueries {
	t := Quote(table)
	const older = `consumed_at < ` + now + ` - INTERVAL $1 MICROSECOND`
	return &protocol.InboxQueries{
		Table: t,
		// A plain INSERT: a duplicate is error 1062, which rolls back that
		// statement alone. (INSERT IGNORE would turn a too-long or badly
		// encoded message ID into a warning and a truncated ID.)
		Insert:        `INSERT INTO ` + t + ` (consumer, message_id, consumed_at) VALUES ($1, $2, ` + now + `)`,
		InsertAffects: true,
		Purge:         `DELETE FROM ` + t + ` WHERE ` + older + ` ORDER BY consumed_at, consumer, message_id LIMIT $2`,
		CountExpired:  `SELECT COUNT(*) FROM ` + t + ` WHERE ` + older,
	}
}
