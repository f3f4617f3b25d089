package idem

import (
	"bytes"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Record statuses, as stored in the status column.
const (
	// StatusProcessing: claimed, not finished. Inside a transaction the row is
	// invisible to others until commit; in lease mode it is committed with a
	// lease (locked_until).
	StatusProcessing = "processing"
	// StatusSucceeded: fn returned a value; response holds it encoded.
	StatusSucceeded = "succeeded"
	// StatusFailed: fn returned a Permanent error; response holds its message.
	StatusFailed = "failed"
	// StatusIssued: a token IssueToken handed out, not used yet.
	StatusIssued = "issued"
)

// Record is a record row as operators see it: what Lookup and Stuck return.
type Record struct {
	// Scope and ID name the key.
	Scope, ID string
	// Status is StatusProcessing, StatusSucceeded, StatusFailed or
	// StatusIssued.
	Status string
	// Attempt is the fencing token of lease mode: 1 for the first holder,
	// incremented by every takeover. Tokens not yet used have 0.
	Attempt int32
	// Fingerprint is the request digest the key was first used with (nil
	// when none was given).
	Fingerprint []byte
	// Response is the encoded result (or, for StatusFailed, the recorded
	// error message; for a lease still processing, its checkpoint data).
	Response []byte
	// LockedUntil is the end of a lease-mode record's lease, or nil.
	LockedUntil *time.Time
	// RecoveryPoint is the last checkpoint of a lease, or "".
	RecoveryPoint string
	// CreatedAt, UpdatedAt and ExpiresAt are by the database clock. After
	// ExpiresAt the key counts as unused and Purge may delete the record.
	CreatedAt, UpdatedAt, ExpiresAt time.Time
}

// DefaultTable is the record table's name unless WithTable says otherwise.
const DefaultTable = "idempotent_record"

// queries are the statements for one record table.
type queries struct {
	// table is the record table's sanitized, schema-qualified name.
	table string
	// claim inserts a processing record; it returns no row when the key
	// exists (after waiting for an uncommitted holder to finish).
	claim string
	// claimIssued claims a server-issued token (RequireIssued): it never
	// creates a record.
	claimIssued string
	// issue stores a new token.
	issue string
	// leaseClaim and leaseClaimIssued commit a processing record with a
	// lease, taking over expired leases; the other lease statements are
	// guarded by status = 'processing' AND attempt = $3.
	leaseClaim, leaseClaimIssued                            string
	leaseUpdate, leaseCheckpoint, leaseFinish, leaseRelease string
	// purge deletes a batch of expired records (never a lease record still
	// processing); purgeSkipLocked also skips rows other transactions hold.
	purge, purgeSkipLocked string
	// read returns the record of a key (recordColumns).
	read string
	// takeover re-claims an expired or orphaned record, waiting for a
	// transaction that holds its row; takeoverNoWait skips such a row.
	takeover       string
	takeoverNoWait string
	// complete finishes a processing record; it raises an error unless
	// exactly one row matched, so a pipelined COMMIT cannot commit a lost
	// completion.
	complete string
	// release deletes a processing record whose fn failed.
	release string
	// claimNoWait and claimIssuedNoWait are claim and claimIssued for
	// no-wait mode in a caller's transaction: one statement that gives the
	// claim a lock_timeout of noWaitLockTimeout and puts the previous value
	// back when it ends (see noWait).
	claimNoWait, claimIssuedNoWait string
	// ownClaims are the claims of Do's own transaction, indexed by
	// [issued][noWait][bounded]. What must follow a claim that succeeded
	// goes in its RETURNING, evaluated for the claimed row: the caller's
	// lock_timeout put back (no-wait), and the hold timeout's bound of $5
	// milliseconds (bounded). A claim that claims nothing returns no row and
	// sets nothing; Do then rolls its transaction back.
	ownClaims [2][2][2]string
}

// noWaitLockTimeout is the lock_timeout under which a no-wait claim gives up
// on a key held by an uncommitted transaction. It is not shorter because the
// claim's INSERT also takes short-lived locks that have nothing to do with
// the key (extending the table under concurrent inserts), and a 1ms timeout
// turned those into spurious ErrInProgress answers for new keys.
const noWaitLockTimeout = "50ms"

// noWaitPrev begins a no-wait claim: it lowers lock_timeout to
// noWaitLockTimeout for the rest of the transaction and keeps the caller's
// value in idem_prev, which the claim reads its values from, so that the
// setting is in place before the claim runs.
const noWaitPrev = `WITH idem_prev AS MATERIALIZED (
	SELECT current_setting('lock_timeout') AS idem_lock_timeout,
		set_config('lock_timeout', '` + noWaitLockTimeout + `', true) AS idem_claim_timeout)`

// noWait wraps a claim (an INSERT or UPDATE that reads its values from
// idem_prev and returns attempt) into one statement that runs it under a
// transaction-local lock_timeout of noWaitLockTimeout and then puts the
// caller's value back, so that no-wait mode costs no round trip of its own.
// It returns one row: the claimed attempt (NULL when the claim claimed
// nothing) and the restored setting.
//
// The order follows from data, not from the planner's choices. The claim
// reads idem_prev, whose row is computed by the set_config that lowers the
// timeout. The restoring set_config is in the projection of the one row of
// an aggregate over the claim's output: an aggregate yields its row only
// once it has read all of its input, so the claim has run by then, and an
// aggregate without GROUP BY always yields exactly one row, so the restore
// runs whether the claim returned a row or not. There is no join.
//
// If the claim fails (the timeout, or any error), the statement fails, and
// the transaction or savepoint that is rolled back undoes the setting too.
// The timeout covers the wait for the key's holder; the table lock the
// statement takes before it runs is waited for under the caller's
// lock_timeout.
func noWait(claim string) string {
	return noWaitPrev + `,
idem_claim AS (
` + claim + `)
SELECT c.attempt, set_config('lock_timeout', (SELECT idem_lock_timeout FROM idem_prev), true)
FROM (SELECT max(attempt) AS attempt FROM idem_claim) AS c`
}

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

// Columns every record-returning query yields, in order.
const recordColumns = `attempt, status, fingerprint, response,
	expires_at <= clock_timestamp(),
	locked_until IS NOT NULL,
	coalesce(locked_until > clock_timestamp(), false)`

var queryCache sync.Map // table identifier (sanitized) -> *queries

func queriesFor(table string) *queries {
	if q, ok := queryCache.Load(table); ok {
		return q.(*queries)
	}
	q := buildQueries(table)
	actual, _ := queryCache.LoadOrStore(table, q)
	return actual.(*queries)
}

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

func buildQueries(t string) *queries {
	// Expiry counts from the claim (the database clock now, not the start of a
	// long caller transaction), so a record is never born expired.
	const ttlExpr = `clock_timestamp() + $4::bigint * interval '1 microsecond'`
	// A claimed token starts at attempt 1; any other takeover fences out the
	// previous holder by incrementing it.
	const takeoverSet = `status = 'processing', fingerprint = $3, response = NULL,
	attempt = CASE WHEN status = 'issued' THEN 1 ELSE attempt + 1 END,
	locked_until = NULL, recovery_point = NULL,
	created_at = now(), updated_at = now(), expires_at = ` + ttlExpr
	// takeable mirrors record.takeable.
	const takeable = `((locked_until IS NULL OR locked_until <= clock_timestamp())
	AND (expires_at <= clock_timestamp() OR status IN ('issued', 'processing')))`
	// The claims, with the clause that makes the no-wait forms read their
	// values from idem_prev (see noWait), and what they return.
	claimWith := func(from, returning string) string {
		return `INSERT INTO ` + t + ` (scope, key, fingerprint, status, attempt, created_at, updated_at, expires_at)
	SELECT $1::text, $2::text, $3::bytea, 'processing', 1, now(), now(), ` + ttlExpr + from + `
	ON CONFLICT (scope, key) DO NOTHING
	` + returning
	}
	claimIssuedWith := func(from, returning string) string {
		return `UPDATE ` + t + ` SET ` + takeoverSet + from + `
WHERE scope = $1 AND key = $2 AND status = 'issued' AND expires_at > clock_timestamp()
` + returning
	}
	claim := func(from string) string { return claimWith(from, `RETURNING attempt`) }
	claimIssued := func(from string) string { return claimIssuedWith(from, `RETURNING attempt`) }
	var own [2][2][2]string
	for issued := range 2 {
		for nowait := range 2 {
			for bounded := range 2 {
				from, returning := "", `RETURNING attempt`
				if nowait == 1 {
					from = " FROM idem_prev"
					returning += `, set_config('lock_timeout', (SELECT idem_lock_timeout FROM idem_prev), true)`
				}
				if bounded == 1 {
					returning += ", " + holdBound("$5")
				}
				q := claimWith(from, returning)
				if issued == 1 {
					q = claimIssuedWith(from, returning)
				}
				if nowait == 1 {
					q = noWaitPrev + "\n" + q
				}
				own[issued][nowait][bounded] = q
			}
		}
	}
	return &queries{
		ownClaims:         own,
		table:             t,
		claim:             claim(""),
		claimNoWait:       noWait(claim(" FROM idem_prev")),
		claimIssued:       claimIssued(""),
		claimIssuedNoWait: noWait(claimIssued(" FROM idem_prev")),

		issue: `INSERT INTO ` + t + ` (scope, key, status, attempt, created_at, updated_at, expires_at)
	VALUES ($1, $2, 'issued', 0, now(), now(), clock_timestamp() + $3::bigint * interval '1 microsecond')`,

		leaseClaim: `INSERT INTO ` + t + ` AS r (scope, key, fingerprint, status, attempt, locked_until, created_at, updated_at, expires_at)
	VALUES ($1, $2, $3, 'processing', 1, clock_timestamp() + $5::bigint * interval '1 microsecond', now(), now(), ` + ttlExpr + `)
	ON CONFLICT (scope, key) DO UPDATE SET ` + leaseTakeoverSet + `
	WHERE ` + leaseTakeable + `
	RETURNING attempt, coalesce(recovery_point, ''), response`,

		leaseClaimIssued: `UPDATE ` + t + ` AS r SET ` + leaseTakeoverSet + `
	FROM (SELECT $3::bytea AS fingerprint, clock_timestamp() + $5::bigint * interval '1 microsecond' AS locked_until,
		` + ttlExpr + ` AS expires_at) AS excluded
	WHERE r.scope = $1 AND r.key = $2 AND r.status <> 'succeeded' AND r.status <> 'failed'
		AND r.expires_at > clock_timestamp() AND ` + leaseTakeable + `
	RETURNING r.attempt, coalesce(r.recovery_point, ''), r.response`,

		// The record outlives its lease: expires_at never falls before
		// locked_until, nor a finished record's before its TTL.
		leaseUpdate: `UPDATE ` + t + ` SET locked_until = clock_timestamp() + $4::bigint * interval '1 microsecond', updated_at = now(),
	expires_at = greatest(expires_at, clock_timestamp() + $4::bigint * interval '1 microsecond')
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		leaseCheckpoint: `UPDATE ` + t + ` SET recovery_point = $4, response = $5, updated_at = now(),
	locked_until = clock_timestamp() + $6::bigint * interval '1 microsecond',
	expires_at = greatest(expires_at, clock_timestamp() + $6::bigint * interval '1 microsecond')
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		leaseFinish: `UPDATE ` + t + ` SET status = $4, response = $5, locked_until = NULL, recovery_point = NULL, updated_at = now(),
	expires_at = greatest(expires_at, clock_timestamp() + $6::bigint * interval '1 microsecond')
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		leaseRelease: `UPDATE ` + t + ` SET locked_until = clock_timestamp() - interval '1 microsecond', updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,

		// purge deletes a batch of purgeable records. The DELETE checks the
		// condition again: a row can change between the subquery's snapshot
		// and the DELETE, and in a partitioned table one ctid names a row in
		// every partition.
		purge: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ` + purgeable + `
	LIMIT $1))
	AND ` + purgeable,

		// purgeSkipLocked is purge for a batch that met a row another
		// transaction holds: locking each row first costs twice the WAL, so
		// it is the fallback, not the rule.
		purgeSkipLocked: `DELETE FROM ` + t + ` WHERE ctid = ANY (ARRAY(
	SELECT ctid FROM ` + t + ` WHERE ` + purgeable + `
	LIMIT $1 FOR UPDATE SKIP LOCKED))
	AND ` + purgeable,

		read: `SELECT ` + recordColumns + ` FROM ` + t + ` WHERE scope = $1 AND key = $2`,

		takeover: `UPDATE ` + t + ` SET ` + takeoverSet + `
WHERE scope = $1 AND key = $2 AND attempt = $5 AND ` + takeable + `
RETURNING attempt`,

		takeoverNoWait: `UPDATE ` + t + ` SET ` + takeoverSet + `
WHERE (scope, key) = (
	SELECT scope, key FROM ` + t + `
	WHERE scope = $1 AND key = $2 AND attempt = $5 AND ` + takeable + `
	FOR UPDATE SKIP LOCKED)
	AND attempt = $5 AND ` + takeable + `
RETURNING attempt`,

		complete: `WITH done AS (
	UPDATE ` + t + ` SET status = $3, response = $4, updated_at = now()
	WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $5
	RETURNING 1
)
SELECT CASE WHEN count(*) = 1 THEN 1
	ELSE ('idem: the processing record changed under its owner; rows matched: ' || count(*))::int END
FROM done`,

		release: `DELETE FROM ` + t + ` WHERE scope = $1 AND key = $2 AND status = 'processing' AND attempt = $3`,
	}
}

// record is a key's row as idem reads it.
type record struct {
	claimed     bool // this call claimed it
	attempt     int32
	status      string
	fingerprint []byte
	response    []byte
	expired     bool // expires_at has passed: treat as absent
	leased      bool // locked_until is set (lease mode)
	leaseLive   bool // locked_until is in the future
}

// scan reads a row of recordColumns into r, and sets found when a row came.
func (r *record) scan(found *bool) func(pgx.Row) error {
	return func(row pgx.Row) error {
		err := row.Scan(&r.attempt, &r.status, &r.fingerprint, &r.response, &r.expired, &r.leased, &r.leaseLive)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		*found = err == nil
		return err
	}
}

// takeable reports whether an existing record may be claimed again: it
// expired, or it is a processing record that nobody holds (an expired lease,
// or a transactional claim that was committed without completion).
func (r *record) takeable() bool {
	if r.leased && r.leaseLive {
		return false // a live lease, whatever the record's expiry
	}
	return r.expired || r.status == StatusIssued || r.status == StatusProcessing
}

// fingerprintMatches reports whether the record was made for the same
// request. Tokens carry no fingerprint and expired records no longer count.
func (r *record) fingerprintMatches(f []byte) bool {
	return r.expired || r.status == StatusIssued || bytes.Equal(r.fingerprint, f)
}
