package protocol

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

// Queries are the statements for one record table, in a Dialect's SQL.
//
// Five statements claim a key: Claim inserts a record, ClaimIssued claims a
// server-issued token, Takeover re-claims a record that expired or that
// nobody holds, and LeaseClaim and LeaseClaimIssued are lease mode's. The
// no-wait mode and the hold timeout are statements queued beside a claim
// (the dialect's NoWaitSet, NoWaitRestore, HoldSet), never variants of
// its text.
type Queries struct {
	// Table is the record table's quoted, possibly schema-qualified name.
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
	// Read returns the record of a key, in the order of Record.Dest.
	Read string
	// Complete finishes a processing record ($3 status, $4 response, $5
	// attempt); it raises an error unless exactly one row matched, so a
	// pipelined COMMIT cannot commit a lost completion.
	Complete string
	// CompleteRows reports that Complete does not check its row itself:
	// the protocol marks it Exactly1, for a driver that runs statements one
	// at a time.
	CompleteRows bool
	// Tokens reports that the dialect decides ownership by a claim token,
	// not by whether a row came back: every claiming statement takes a
	// fresh random token (16 bytes) as one argument more ($5 for Claim and
	// ClaimIssued, $6 for Takeover), and its answer is a row of the key's
	// token followed by Read's columns, whoever holds the key. The key is
	// claimed when the token is the call's. A claiming statement returns
	// that row itself when the dialect says so (ClaimReturns for Claim);
	// otherwise ClaimRead, a locking read with the claim's arguments,
	// follows it in the same group.
	Tokens       bool
	ClaimReturns bool
	ClaimRead    string
	// LeaseRead, with Tokens, follows LeaseClaim and LeaseClaimIssued
	// (whose token is $6): it returns the key's token, attempt, recovery
	// point ('' for none) and response, under the row lock.
	LeaseRead string
	// Release deletes a processing record whose fn failed ($3 attempt).
	Release string
	// LockTable takes the lock every claim takes on the table (ROW
	// EXCLUSIVE) before a no-wait claim lowers lock_timeout, so that a
	// lock on the whole table (DDL, LOCK TABLE) is waited for under the
	// caller's lock_timeout, not answered ErrInProgress. Empty where the
	// database needs no such lock.
	LockTable string
	// Lookup returns a key's record for operators ($1 scope, $2 key), in
	// the order of StoredRecord's scan; Stuck lists expired leases still
	// processing, the longest-expired first ($1 limit).
	Lookup, Stuck string
	// CountExpired counts the records Purge would delete now.
	CountExpired string
	// TimeText reports that the driver may return the times of Lookup,
	// Stuck and Stats as text in UTC (go-sql-driver/mysql without
	// parseTime), which the protocol then parses.
	TimeText bool
	// Stats returns a row per status (one row of NULL status and zero
	// counts for an empty table): the status, its count, how many of them
	// expired, how many are stuck leases, the oldest created_at, and the
	// table's and its indexes' sizes in bytes.
	Stats string
}

// InboxQueries are the statements for one inbox table.
type InboxQueries struct {
	Table string // quoted, possibly schema-qualified
	// Insert claims a message ($1 consumer, $2 message id), returning a row
	// only when it inserted one; with InsertAffects it returns no row, and
	// a duplicate is a unique violation (SQLErrors.Unique).
	Insert        string
	InsertAffects bool
	// Purge deletes a batch ($2 rows) of rows consumed longer ago than $1
	// microseconds, skipping rows other transactions hold; CountExpired
	// counts them all.
	Purge, CountExpired string
}
