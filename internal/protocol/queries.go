package protocol

import (
	"sync"

	"github.com/idemkit/idem/internal/ident"
)

// The statuses of a record, as stored in its status column.
const (
	StatusProcessing = "processing"
	StatusSucceeded  = "succeeded"
	StatusFailed     = "failed"
	StatusIssued     = "issued"
)

// DefaultTable and DefaultInboxTable are the tables' names unless an option
// says otherwise.
const (
	DefaultTable      = "idempotent_record"
	DefaultInboxTable = "idem_inbox"
)

// Queries are the statements for one record table (PostgreSQL's dialect).
//
// Five statements claim a key: Claim inserts a record, ClaimIssued claims a
// server-issued token, Takeover re-claims a record that expired or that
// nobody holds, and LeaseClaim and LeaseClaimIssued are lease mode's. The
// no-wait mode and the hold timeout are statements queued beside a claim
// (NoWaitSet, NoWaitRestore, HoldSet), never variants of its text.
type Queries struct {
	// Table is the record table's sanitized, schema-qualified name.
	Table string
	// Claim inserts a processing record ($1 scope, $2 key, $3 fingerprint,
	// $4 TTL in microseconds) and returns its attempt; it returns no row
	// when the key exists (after waiting for an uncommitted holder).
	Claim string
	// ClaimIssued claims a server-issued token (RequireIssued), with
	// Claim's arguments: it never creates a record.
	ClaimIssued string
	// Takeover re-claims an expired or orphaned record, with Claim's
	// arguments and $5 the attempt the read saw, waiting for a transaction
	// that holds its row.
	Takeover string
	// Issue stores a new token.
	Issue string
	// LeaseClaim and LeaseClaimIssued commit a processing record with a
	// lease, taking over expired leases; the other lease statements are
	// guarded by status = 'processing' AND attempt = $3.
	LeaseClaim, LeaseClaimIssued                            string
	LeaseUpdate, LeaseCheckpoint, LeaseFinish, LeaseRelease string
	// Purge deletes a batch of expired records (never a lease record still
	// processing); PurgeSkipLocked also skips rows other transactions hold.
	Purge, PurgeSkipLocked string
	// Read returns the record of a key (RecordColumns).
	Read string
	// Complete finishes a processing record ($3 status, $4 response, $5
	// attempt); it raises an error unless exactly one row matched, so a
	// pipelined COMMIT cannot commit a lost completion.
	Complete string
	// Release deletes a processing record whose fn failed ($3 attempt).
	Release string
	// LockTable takes the lock every claim takes on the table (ROW
	// EXCLUSIVE) before a no-wait claim lowers lock_timeout, so that a
	// lock on the whole table (DDL, LOCK TABLE) is waited for under the
	// caller's lock_timeout, not answered ErrInProgress.
	LockTable string
}

// NoWaitLockTimeout is the lock_timeout under which a no-wait claim gives up
// on a key held by an uncommitted transaction. It is not shorter because the
// claim's INSERT also takes short-lived locks that have nothing to do with
// the key (extending the table under concurrent inserts), and a 1ms timeout
// turned those into spurious ErrInProgress answers for new keys.
const NoWaitLockTimeout = "50ms"

// NoWaitSet and NoWaitRestore go before and after a no-wait claim, in its
// round trip, after Queries.LockTable: NoWaitSet keeps the transaction's
// lock_timeout in the transaction-local setting idem.lock_timeout and
// lowers it to NoWaitLockTimeout; NoWaitRestore puts it back. A claim that
// fails (the timeout, or any error) leaves NoWaitRestore unrun, and the
// rollback of the transaction or savepoint that follows undoes NoWaitSet
// too. The timeout covers the wait for the key's holder; the table lock,
// taken before it, is waited for under the caller's lock_timeout.
const (
	NoWaitSet = `SELECT set_config('idem.lock_timeout', s.v, true), set_config('lock_timeout', '` + NoWaitLockTimeout + `', true)
	FROM (SELECT current_setting('lock_timeout') AS v) AS s`
	NoWaitRestore = `SELECT set_config('lock_timeout', s.v, true) FROM (SELECT current_setting('idem.lock_timeout') AS v) AS s`
)

// HoldSet lowers idle_in_transaction_session_timeout and statement_timeout
// to $1 milliseconds for the rest of the transaction, keeping a value that
// is already lower (0 means none). HoldRead reads the values it replaces,
// so that a call in the caller's transaction can put them back
// (HoldRestore).
const (
	HoldSet = `SELECT count(set_config(g.name,
	CASE WHEN g.cur = interval '0' OR g.cur > $1::bigint * interval '1 ms' THEN $1::text ELSE g.setting END, true))
FROM (SELECT v.name, current_setting(v.name) AS setting, current_setting(v.name)::interval AS cur
	FROM (VALUES ('idle_in_transaction_session_timeout'), ('statement_timeout')) AS v(name)) AS g`
	HoldRead    = `SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout')`
	HoldRestore = `SELECT set_config('idle_in_transaction_session_timeout', $1, true), set_config('statement_timeout', $2, true)`
)

// Purgeable is the condition of a record Purge deletes, which CountExpired
// and TableStats count. statement_timestamp(), being stable, lets the
// expires_at index find the rows. Lease-mode records (locked_until set)
// still processing are never purged: a new record would restart the fencing
// token at 1 while a paused holder of attempt 1 could still wake up; the
// next Claim of the key takes them over instead.
const Purgeable = `expires_at <= statement_timestamp() AND NOT (status = 'processing' AND locked_until IS NOT NULL)`

// StuckLease is the condition of a lease-mode record still processing whose
// lease ran out, as Stuck and TableStats list and count them.
const StuckLease = `status = 'processing' AND locked_until <= clock_timestamp()`

// RecordColumns are what every record-returning query yields, in the order
// of Record.Dest.
const RecordColumns = `attempt, status, fingerprint, response,
	expires_at <= clock_timestamp(),
	locked_until IS NOT NULL,
	coalesce(locked_until > clock_timestamp(), false)`

var queryCache sync.Map // table identifier (sanitized) -> *Queries

// QueriesFor returns the statements of the record table named table, an
// identifier already sanitized (ident.Qualified).
func QueriesFor(table string) *Queries {
	if q, ok := queryCache.Load(table); ok {
		return q.(*Queries)
	}
	q := buildQueries(table)
	actual, _ := queryCache.LoadOrStore(table, q)
	return actual.(*Queries)
}

// DefaultQueries are the statements of DefaultTable in the search_path.
var DefaultQueries = QueriesFor(ident.Qualified("", DefaultTable))

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

func buildQueries(t string) *Queries {
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
	return &Queries{
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
	SELECT ctid FROM ` + t + ` WHERE ` + Purgeable + `
	LIMIT $1))
	AND ` + Purgeable,

		// PurgeSkipLocked is Purge for a batch that met a row another
		// transaction holds: locking each row first costs twice the WAL, so
		// it is the fallback, not the rule.
		PurgeSkipLocked: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ` + Purgeable + `
	LIMIT $1 FOR UPDATE SKIP LOCKED))
	AND ` + Purgeable,

		Read: `SELECT ` + RecordColumns + ` FROM ` + t + ` WHERE scope = $1 AND key = $2`,

		Complete: `WITH done AS (
	UPDATE ` + t + ` SET status = $3, response = $4, updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $5
	RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
	ELSE ('idem: the processing record changed under its owner; rows matched: ' || count(*))::int END
FROM done`,

		Release: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,
	}
}

// InboxQueries are the statements for one inbox table.
type InboxQueries struct {
	Table  string // sanitized, schema-qualified
	Insert string
	Purge  string
}

// DefaultInboxQueries are the statements of DefaultInboxTable in the
// search_path.
var DefaultInboxQueries = InboxQueriesFor(ident.Qualified("", DefaultInboxTable))

// InboxQueriesFor returns the statements of the inbox table named table, an
// identifier already sanitized.
func InboxQueriesFor(t string) *InboxQueries {
	return &InboxQueries{
		Table: t,
		Insert: `INSERT INTO ` + t + ` (consumer, message_id) VALUES ($1, $2)
	ON CONFLICT (consumer, message_id) DO NOTHING RETURNING true`,
		// Purge checks the age again in the DELETE, as the record purge
		// does: in a partitioned table one ctid names a row in every
		// partition.
		Purge: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + t + ` WHERE consumed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'
	LIMIT $2 FOR UPDATE SKIP LOCKED))
	AND consumed_at < statement_timestamp() - $1::bigint * interval '1 microsecond'`,
	}
}
