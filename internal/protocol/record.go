package protocol

import "bytes"

// Record is a key's row as the protocol reads it.
type Record struct {
	Claimed     bool // this call claimed it
	Attempt     int32
	Status      string
	Fingerprint []byte
	Response    []byte
	Expired     bool // expires_at has passed: treat as absent
	Leased      bool // locked_until is set (lease mode)
	LeaseLive   bool // locked_until is in the future
}

// Dest is where a row of Queries.Read is scanned: attempt, status,
// fingerprint, response, whether it expired, whether it has a lease, whether
// the lease is live.
func (r *Record) Dest() []any {
	return []any{&r.Attempt, &r.Status, &r.Fingerprint, &r.Response, &r.Expired, &r.Leased, &r.LeaseLive}
}

// ReadStmt reads key's record into r; found reports whether there is one.
func (q *Queries) ReadStmt(key Key, r *Record, found *bool) Stmt {
	return Stmt{SQL: q.Read, Args: []any{key.Scope, key.ID}, Dest: r.Dest(), Found: found}
}

// Takeable reports whether an existing record may be claimed again: it
// expired, or it is a processing record that nobody holds (an expired lease,
// or a transactional claim that was committed without completion).
func (r *Record) Takeable() bool {
	if r.Leased && r.LeaseLive {
		return false // a live lease, whatever the record's expiry
	}
	return r.Expired || r.Status == StatusIssued || r.Status == StatusProcessing
}

// FingerprintMatches reports whether the record was made for the same
// request. Tokens carry no fingerprint and expired records no longer count.
func (r *Record) FingerprintMatches(f []byte) bool {
	return r.Expired || r.Status == StatusIssued || bytes.Equal(r.Fingerprint, f)
}

// NonNilFingerprint stores "no fingerprint" as an empty bytea, so that nil
// and empty compare equal on replay.
func NonNilFingerprint(f []byte) []byte {
	if f == nil {
		return []byte{}
	}
	return f
}

// completeStmt finishes key's processing record claimed at attempt with
// status and data.
func (c *Config) completeStmt(key Key, status string, data []byte, attempt int32) Stmt {
	return Stmt{SQL: c.Q.Complete, Args: []any{key.Scope, key.ID, status, data, attempt}, Exactly1: c.Q.CompleteRows}
}
