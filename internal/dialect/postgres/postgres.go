// Package postgres is PostgreSQL's dialect of the protocol: the statements
// of the record table, the inbox and the state machine, the settings the
// claim queues beside itself, and the classification of PostgreSQL's
// errors by SQLSTATE. Both PostgreSQL drivers (pgx, and database/sql with
// lib/pq or pgx's stdlib) use it.
package postgres

import (
	"strings"

	"github.com/idemkit/idem/internal/ident"
	"github.com/idemkit/idem/internal/pgerr"
	"github.com/idemkit/idem/internal/protocol"
)

// Dialect is PostgreSQL's.
var Dialect = &protocol.Dialect{
	Name:    "PostgreSQL",
	Records: records,
	Inbox:   inbox,
	Machine: machine,
	Statements: protocol.Statements{
		ClaimLockTimeout: `SELECT set_config('lock_timeout', '` + ClaimLockTimeout + `', true)`,
		PurgeLockTimeout: `SELECT set_config('lock_timeout', '` + PurgeLockTimeout + `', true)`,
		ReadCommitted:    `SET TRANSACTION ISOLATION LEVEL READ COMMITTED`,
		NoWaitSet:        noWaitSet,
		NoWaitRestore:    noWaitRestore,
		HoldSet:          holdSet,
		HoldRead:         holdRead,
		HoldRestore:      holdRestore,
		ReadCommittedNow: `SELECT current_setting('transaction_isolation') = 'read committed'`,
	},
	SQLErrors: protocol.SQLErrors{
		Unique:       func(err error) bool { return pgerr.Code(err) == pgerr.UniqueViolation },
		IdleTimeout:  func(err error) bool { return pgerr.Code(err) == pgerr.IdleInTxTimeout },
		MissingTable: missingTable,
	},
}

// Quote returns t's quoted, possibly schema-qualified name.
func Quote(t protocol.Table) string { return ident.Qualified(t.Schema, t.Name) }

// missingTable: PostgreSQL names the relation as written, unquoted:
// relation "schema.table" does not exist (42P01).
func missingTable(err error, t protocol.Table) bool {
	return pgerr.Code(err) == pgerr.UndefinedTable && strings.Contains(err.Error(), `"`+t.String()+`"`)
}

// The lock_timeout values of lease mode's claim and of a purge batch.
const (
	ClaimLockTimeout = "100ms"
	PurgeLockTimeout = "20ms"
)

// NoWaitLockTimeout is the lock_timeout under which a no-wait claim gives up
// on a key held by an uncommitted transaction. It is not shorter because the
// claim's INSERT also takes short-lived locks that have nothing to do with
// the key (extending the table under concurrent inserts), and a 1ms timeout
// turned those into spurious ErrInProgress answers for new keys.
const NoWaitLockTimeout = "50ms"

// noWaitSet keeps the transaction's lock_timeout in the transaction-local
// setting idem.lock_timeout and lowers it to NoWaitLockTimeout;
// noWaitRestore puts it back. The table's lock, taken before them
// (Queries.LockTable), is waited for under the caller's lock_timeout.
const (
	noWaitSet = `SELECT set_config('idem.lock_timeout', s.v, true), set_config('lock_timeout', '` + NoWaitLockTimeout + `', true)
	FROM (SELECT current_setting('lock_timeout') AS v) AS s`
	noWaitRestore = `SELECT set_config('lock_timeout', s.v, true) FROM (SELECT current_setting('idem.lock_timeout') AS v) AS s`
)

// holdSet lowers idle_in_transaction_session_timeout and statement_timeout
// to $1 milliseconds for the rest of the transaction, keeping a value that
// is already lower (0 means none).
const (
	holdSet = `SELECT count(set_config(g.name,
	CASE WHEN g.cur = interval '0' OR g.cur > $1::bigint * interval '1 ms' THEN $1::text ELSE g.setting END, true))
FROM (SELECT v.name, current_setting(v.name) AS setting, current_setting(v.name)::interval AS cur
	FROM (VALUES ('idle_in_transaction_session_timeout'), ('statement_timeout')) AS v(name)) AS g`
	holdRead    = `SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout')`
	holdRestore = `SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('statement_timeout', $2, true)`
)

// purgeable is the condition of a record Purge deletes, which CountExpired
// and TableStats count. statement_timestamp(), being stable, lets the
// expires_at index find the rows. Lease-mode records (locked_until set)
// still processing are never purged: a new record would restart the fencing
// token at 1 while a paused holder of attempt 1 could still wake up; the
// next Claim of the key takes them over instead.
const purgeable = `expires_at <= statement_timestamp() AND NOT (status = 'processing' AND locked_until IS NOT NULL)`

// stuckLease is the condition of a lease-mode record still processing whose
// lease ran out, as Stuck and TableStats list and count them.
const stuckLease = `status = 'processing' AND locked_until <= clock_timestamp()`

// recordColumns are what every record-returning query yields, in the order
// of protocol.Record.Dest.
const recordColumns = `attempt, status, fingerprint, response,
	expires_at <= clock_timestamp(),
	locked_until IS NOT NULL,
	coalesce(locked_until > clock_timestamp(), false)`

// inspectColumns are what Lookup and Stuck read, in the order of
// protocol.StoredRecord's scan.
const inspectColumns = `scope, key, status, attempt, fingerprint, response, locked_until,
	coalesce(recovery_point, ''), created_at, updated_at, expires_at`

// leaseTakeoverSet re-claims a record in lease mode. A takeover of a lease
// on the same request keeps the checkpoint (recovery_point and the data in
// response), so the new holder resumes; an expired record or a token starts
// afresh. It refers to the new values as excluded.
const leaseTakeoverSet = `status = 'processing', fingerprint = excluded.fingerprint,
	attempt = CASE WHEN r.status = 'issued' THEN 1 ELSE r.attempt + 1 END,
	locked_until = excluded.locked_until,
	recovery_point = CASE WHEN r.status = 'processing' AND r.expires_at > clock_timestamp() THEN r.recovery_point END,
	response = CASE WHEN r.status = 'processing' AND r.expires_at > clock_timestamp() THEN r.response END,
	updated_at = now(), expires_at = excluded.expires_at`

// leaseTakeable: the record expired, is an unclaimed token, or is a
// processing record of the same request whose lease ran out.
// A live lease is never taken over, whatever the record's expiry says.
const leaseTakeable = `((r.locked_until IS NULL OR r.locked_until <= clock_timestamp())
	AND (r.expires_at <= clock_timestamp() OR r.status = 'issued'
		OR (r.status = 'processing' AND r.fingerprint = excluded.fingerprint)))`

func records(table protocol.Table) *protocol.Queries {
	t := Quote(table)
	// Expiry counts from the claim (the database clock now, not the start of a
	// long caller transaction), so a record is never born expired.
	const ttlExpr = `clock_timestamp() + $4::bigint * interval '1 microsecond'`
	// A claimed token starts at attempt 1; any other takeover fences out the
	// previous holder by incrementing it.
	const takeoverSet = `status = 'processing', fingerprint = $3, response = NULL,
	attempt = CASE WHEN status = 'issued' THEN 1 ELSE attempt + 1 END,
	locked_until = NULL, recovery_point = NULL,
	created_at = now(), updated_at = now(), expires_at = ` + ttlExpr
	// takeable mirrors Record.Takeable.
	const takeable = `((locked_until IS NULL OR locked_until <= clock_timestamp())
	AND (expires_at <= clock_timestamp() OR status IN ('issued', 'processing')))`
	return &protocol.Queries{
		Table:     t,
		LockTable: `LOCK TABLE ` + t + ` IN ROW EXCLUSIVE MODE`,
		Claim: `INSERT INTO ` + t + ` (scope, key, fingerprint, status, attempt, created_at, updated_at, expires_at)
	VALUES ($1, $2, $3, 'processing', 1, now(), now(), ` + ttlExpr + `)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING attempt`,

		ClaimIssued: `UPDATE ` + t + ` SET ` + takeoverSet + `
WHERE scope = $1 AND key = $2 AND status = 'issued' AND expires_at > clock_timestamp()
RETURNING attempt`,

		Takeover: `UPDATE ` + t + ` SET ` + takeoverSet + `
WHERE scope = $1 AND key = $2 AND attempt = $5 AND ` + takeable + `
RETURNING attempt`,

		Issue: `INSERT INTO ` + t + ` (scope, key, status, attempt, created_at, updated_at, expires_at)
	VALUES ($1, $2, 'issued', 0, now(), now(), clock_timestamp() + $3::bigint * interval '1 microsecond')`,

		LeaseClaim: `INSERT INTO ` + t + ` AS r (scope, key, fingerprint, status, attempt, locked_until, created_at, updated_at, expires_at)
	VALUES ($1, $2, $3, 'processing', 1, clock_timestamp() + $5::bigint * interval '1 microsecond', now(), now(), ` + ttlExpr + `)
	ON CONFLICT (scope, key) DO UPDATE SET ` + leaseTakeoverSet + `
	WHERE ` + leaseTakeable + `
	RETURNING attempt, coalesce(recovery_point, ''), response`,

		LeaseClaimIssued: `UPDATE ` + t + ` AS r SET ` + leaseTakeoverSet + `
	FROM (SELECT $3::bytea AS fingerprint, clock_timestamp() + $5::bigint * interval '1 microsecond' AS locked_until,
		` + ttlExpr + ` AS expires_at) AS excluded
	WHERE r.scope = $1 AND r.key = $2 AND r.status <> 'succeeded' AND r.status <> 'failed'
		AND r.expires_at > clock_timestamp() AND ` + leaseTakeable + `
	RETURNING r.attempt, coalesce(r.recovery_point, ''), r.response`,

		// The record outlives its lease: expires_at never falls before
		// locked_until, nor a finished record's before its TTL.
		LeaseUpdate: `UPDATE ` + t + ` SET locked_until = clock_timestamp() + $4::bigint * interval '1 microsecond', updated_at = now(),
	expires_at = greatest(expires_at, clock_timestamp() + $4::bigint * interval '1 microsecond')
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		LeaseCheckpoint: `UPDATE ` + t + ` SET recovery_point = $4, response = $5, updated_at = now(),
	locked_until = clock_timestamp() + $6::bigint * interval '1 microsecond',
	expires_at = greatest(expires_at, clock_timestamp() + $6::bigint * interval '1 microsecond')
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		LeaseFinish: `UPDATE ` + t + ` SET status = $4, response = $5, locked_until = NULL, recovery_point = NULL, updated_at = now(),
	expires_at = greatest(expires_at, clock_timestamp() + $6::bigint * interval '1 microsecond')
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		LeaseRelease: `UPDATE ` + t + ` SET locked_until = clock_timestamp() - interval '1 microsecond', updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		// Purge deletes a batch of purgeable records. The DELETE checks the
		// condition again: a row can change between the subquery's snapshot
		// and the DELETE, and in a partitioned table one ctid names a row in
		// every partition.
		Purge: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ` + purgeable + `
	LIMIT $1))
	AND ` + purgeable,

		// PurgeSkipLocked is Purge for a batch that met a row another
		// transaction holds: locking each row first costs twice the WAL, so
		// it is the fallback, not the rule.
		PurgeSkipLocked: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ` + purgeable + `
	LIMIT $1 FOR UPDATE SKIP LOCKED))
	AND ` + purgeable,

		Read: `SELECT ` + recordColumns + ` FROM ` + t + ` WHERE scope = $1 AND key = $2`,

		Complete: `WITH done AS (
	UPDATE ` + t + ` SET status = $3, response = $4, updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $5
	RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
	ELSE ('idem: the processing record changed under its owner; rows matched: ' || count(*))::int END
FROM done`,

		Release: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		Lookup: `SELECT ` + inspectColumns + ` FROM ` + t + ` WHERE scope = $1 AND key = $2`,

		Stuck: `SELECT ` + inspectColumns + ` FROM ` + t + `
	WHERE ` + stuckLease + `
	ORDER BY locked_until LIMIT $1`,

		CountExpired: `SELECT count(*) FROM ` + t + ` WHERE ` + purgeable,

		// One statement, one scan, one snapshot: a row per status (none for
		// an empty table, hence the outer join), each with the sizes.
		Stats: `WITH s AS (SELECT status, count(*) AS n,
		count(*) FILTER (WHERE ` + purgeable + `) AS expired,
		count(*) FILTER (WHERE ` + stuckLease + `) AS stuck,
		min(created_at) AS oldest
	FROM ` + t + ` GROUP BY status)
	SELECT s.status, coalesce(s.n, 0), coalesce(s.expired, 0), coalesce(s.stuck, 0), s.oldest,
		pg_table_size('` + t + `'::regclass), pg_indexes_size('` + t + `'::regclass)
	FROM (SELECT 1) AS one LEFT JOIN s ON true`,
	}
}

func inbox(table protocol.Table) *protocol.InboxQueries {
	t := Quote(table)
	const older = `consumed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'`
	return &protocol.InboxQueries{
		Table: t,
		Insert: `INSERT INTO ` + t + ` (consumer, message_id) VALUES ($1, $2)
	ON CONFLICT (consumer, message_id) DO NOTHING RETURNING true`,
		// Purge checks the age again in the DELETE, as the record purge
		// does: in a partitioned table one ctid names a row in every
		// partition.
		Purge: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ` + older + `
	LIMIT $2 FOR UPDATE SKIP LOCKED))
	AND ` + older,
		CountExpired: `SELECT count(*) FROM ` + t + ` WHERE ` + older,
	}
}
