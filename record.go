package idem

import (
	"fmt"
	"sync"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// MaxKeyLen is the longest Key.Scope or Key.ID accepted, in bytes.
const MaxKeyLen = 255

// Key names one logical operation.
type Key struct {
	// Scope is the owner of the key: a user, a tenant, an endpoint. Keys never
	// match across scopes, so one caller's key can never replay another
	// caller's result. It must be 1..255 bytes of printable UTF-8.
	Scope string
	// ID is the caller's idempotency key, 1..255 bytes of printable UTF-8
	// (letters, marks, numbers, punctuation, symbols and spaces; no control or
	// format characters).
	ID string
	// Fingerprint is an optional digest of the request (SHA-256 of the body,
	// say). When the key was first used with another fingerprint the call
	// fails with ErrKeyReused. nil and empty are the same fingerprint.
	Fingerprint []byte
}

// Validate reports whether k is well formed. It returns an *InvalidKeyError
// (matching ErrInvalidKey) or nil. WithIdempotency and Do call it before any
// SQL.
func (k Key) Validate() error {
	if err := validatePart("Scope", k.Scope); err != nil {
		return err
	}
	return validatePart("ID", k.ID)
}

func validatePart(field, s string) error {
	switch {
	case s == "":
		return &InvalidKeyError{Field: field, Reason: "is empty"}
	case len(s) > MaxKeyLen:
		return &InvalidKeyError{Field: field, Reason: fmt.Sprintf("is %d bytes long; the limit is %d", len(s), MaxKeyLen)}
	}
	if !utf8.ValidString(s) {
		return &InvalidKeyError{Field: field, Reason: "is not valid UTF-8"}
	}
	for i, r := range s {
		switch {
		case r == 0:
			return &InvalidKeyError{Field: field, Reason: fmt.Sprintf("contains NUL (byte %d)", i)}
		case unicode.IsControl(r):
			return &InvalidKeyError{Field: field, Reason: fmt.Sprintf("contains control character %U (byte %d)", r, i)}
		case !unicode.IsGraphic(r):
			return &InvalidKeyError{Field: field, Reason: fmt.Sprintf("contains non-printable character %U (byte %d)", r, i)}
		}
	}
	return nil
}

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
)

// DefaultTable is the record table's name unless WithTable says otherwise.
const DefaultTable = "idempotent_record"

// queries are the statements for one record table.
type queries struct {
	// claim inserts a processing record; it returns no row when the key
	// exists (after waiting for an uncommitted holder to finish).
	claim string
	// read returns the record of a key.
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
	// saveLockTimeout / setLockTimeout implement no-wait mode.
	saveLockTimeout string
	setLockTimeout  string
}

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

func buildQueries(t string) *queries {
	// Expiry counts from the claim (the database clock now, not the start of a
	// long caller transaction), so a record is never born expired.
	const ttlExpr = `clock_timestamp() + $4::bigint * interval '1 microsecond'`
	const takeoverSet = `status = 'processing', fingerprint = $3, response = NULL,
	attempt = attempt + 1, locked_until = NULL, recovery_point = NULL,
	created_at = now(), updated_at = now(), expires_at = ` + ttlExpr
	// takeable mirrors record.takeable.
	const takeable = `(expires_at <= clock_timestamp()
	OR (status = 'processing' AND (locked_until IS NULL OR locked_until <= clock_timestamp())))`
	return &queries{
		claim: `INSERT INTO ` + t + ` (scope, key, fingerprint, status, attempt, created_at, updated_at, expires_at)
	VALUES ($1, $2, $3, 'processing', 1, now(), now(), ` + ttlExpr + `)
	ON CONFLICT (scope, key) DO NOTHING
	RETURNING true, attempt, 'processing', NULL::bytea, NULL::bytea, false, false, false`,

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

		saveLockTimeout: `SELECT current_setting('lock_timeout')`,
		setLockTimeout:  `SELECT set_config('lock_timeout', $1, true)`,
	}
}

// record is a key's row as idem reads it.
type record struct {
	claimed     bool // this statement inserted it
	attempt     int32
	status      string
	fingerprint []byte
	response    []byte
	expired     bool // expires_at has passed: treat as absent
	leased      bool // locked_until is set (lease mode)
	leaseLive   bool // locked_until is in the future
}

func (r *record) scanTargets(withClaimed bool) []any {
	t := []any{&r.attempt, &r.status, &r.fingerprint, &r.response, &r.expired, &r.leased, &r.leaseLive}
	if withClaimed {
		return append([]any{&r.claimed}, t...)
	}
	return t
}

// takeable reports whether an existing record may be claimed again: it
// expired, or it is a processing record that nobody holds (an expired lease,
// or a transactional claim that was committed without completion).
func (r *record) takeable() bool {
	if r.expired {
		return true
	}
	return r.status == StatusProcessing && (!r.leased || !r.leaseLive)
}

// tableIdent returns the sanitized, possibly schema-qualified table name.
func tableIdent(schema, table string) string {
	if schema == "" {
		return pgx.Identifier{table}.Sanitize()
	}
	return pgx.Identifier{schema, table}.Sanitize()
}
