package protocol

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"time"
)

// The claim protocol.
//
// A call claims its key with one INSERT ... ON CONFLICT DO NOTHING of a
// processing record. The unique index is the lock: a second claim of the
// key waits for the transaction that holds it. When that transaction
// commits, the claim inserts nothing and the record is read (in the next
// round trip: the INSERT's snapshot predates the commit) and judged:
//
//   - a finished record is replayed; one made for another fingerprint
//     answers ErrKeyReused; a live lease answers ErrInProgress;
//   - an expired record, a processing record nobody holds, or an issued
//     token is taken over, with an UPDATE guarded by the attempt number the
//     read saw;
//   - a record that vanished in between (purged) is claimed again.
//
// Two strategies carry these steps, one per kind of transaction:
//
//   - inTx, in the caller's transaction (WithIdempotency): savepoints keep a
//     refused or failed claim away from the caller's own work;
//   - own, in a transaction of the protocol's own (Do): every claim or
//     takeover begins the transaction in its round trip, and every read
//     after a conflict ends it in its round trip, so an execution costs
//     the round trips of a bare transaction and a replay two.
//
// No-wait mode queues the table's lock, the dialect's NoWaitSet and
// NoWaitRestore around the claiming statement, whichever it is; a claim
// that times out is ErrInProgress.

// MaxClaimTries bounds the claim loop, whose every turn runs one claiming
// statement (the INSERT, or a takeover) and, when it claims nothing, the
// read: a record purged between the claim and the read, or taken over by
// another transaction first, sends the call around again. 32 turns are 16
// rounds of a claim and a takeover.
const MaxClaimTries = 32

// Savepoint names. PostgreSQL resolves a repeated name to the most recent
// savepoint, so nested calls with distinct keys work.
const (
	spFn    = "idem_fn"
	spClaim = "idem_claim"
)

// claimStep is one statement that may claim the key: the INSERT, or the
// UPDATE of a token or of a record to take over. Without claim tokens
// (Queries.Tokens) it returns the claimed attempt, or no row when it
// claimed nothing.
type claimStep struct {
	// token is the call's claim token (Queries.Tokens), nil without.
	token []byte
	sql   string
	args  []any
	// changes reports that the statement updates a record that existed
	// before it (an issued token, a record taken over) rather than
	// inserting one: undoing the execution must put that record back.
	changes bool
	// returns reports that the statement returns the token and the record
	// itself (Queries.ClaimReturns); otherwise ClaimRead follows it.
	returns bool
}

// claimAnswer is what a claiming step found.
type claimAnswer struct {
	attempt int32
	claimed bool
	// With claim tokens, the claim reads the key's token and record
	// whoever holds it: read reports that rec and found are that read.
	read  bool
	token []byte
	rec   Record
	found bool
}

// claimStrategy runs the steps of the claim in one kind of transaction.
type claimStrategy interface {
	// open runs st, opening what holds the execution: savepoints (inTx) or
	// the transaction (own). When st claimed nothing, what it opened stays
	// open for read.
	open(ctx context.Context, st *claimStep, a *claimAnswer) error
	// read reads the key's record, unless the claim read it already
	// (a.read), and closes what open opened.
	read(ctx context.Context, a *claimAnswer) (rec Record, found bool, err error)
}

// claimStmts are the statements of a claiming step, with the bound of its
// wait: the dialect's prefix (ClaimPrefix), or no-wait mode's settings
// around it.
func claimStmts(ctx context.Context, c *Config, st *claimStep, a *claimAnswer) []Stmt {
	query := st.sql
	if c.D.ClaimPrefix != nil {
		query = c.D.ClaimPrefix(c.NoWait, waitLeft(ctx)) + query
	}
	var claim []Stmt
	switch {
	case !c.Q.Tokens:
		claim = []Stmt{{SQL: query, Args: st.args, Dest: []any{&a.attempt}, Found: &a.claimed}}
	case st.returns:
		claim = []Stmt{{SQL: query, Args: st.args, Dest: a.dest(), Found: &a.found}}
	default:
		claim = []Stmt{{SQL: query, Args: st.args}, {SQL: c.Q.ClaimRead, Args: st.args, Dest: a.dest(), Found: &a.found}}
	}
	if !c.NoWait || c.D.ClaimPrefix != nil {
		return claim
	}
	stmts := make([]Stmt, 0, 4)
	if c.Q.LockTable != "" {
		stmts = append(stmts, Stmt{SQL: c.Q.LockTable})
	}
	stmts = append(stmts, Stmt{SQL: c.D.NoWaitSet})
	stmts = append(stmts, claim...)
	return append(stmts, Stmt{SQL: c.D.NoWaitRestore})
}

// dest is where a claim with tokens reads the key's token and record.
func (a *claimAnswer) dest() []any { return append([]any{&a.token}, a.rec.Dest()...) }

// judge settles a claim with tokens once its statements ran: the key is
// claimed when its token is the call's.
func (a *claimAnswer) judge(tokens bool, token []byte) {
	if tokens {
		a.read = true
		a.claimed = a.found && bytes.Equal(a.token, token)
		a.attempt = a.rec.Attempt
	}
}

// claimKey claims key with s. It returns the claimed record, or the existing
// record to replay (succeeded, or failed with a Permanent error). Errors are
// ErrInProgress, ErrKeyReused, a *TokenError (RequireIssued), and database
// errors.
func claimKey(ctx context.Context, s claimStrategy, e Errors, key Key, c *Config) (Record, error) {
	q := c.Q
	args := []any{key.Scope, key.ID, NonNilFingerprint(key.Fingerprint), c.TTL.Microseconds()}
	var token []byte
	if q.Tokens {
		token = NewClaimToken()
		args = append(args, token)
	}
	claim := &claimStep{token: token, sql: q.Claim, args: args, returns: q.ClaimReturns}
	if c.RequireIssued {
		claim = &claimStep{token: token, sql: q.ClaimIssued, args: args, changes: true}
	}
	st := claim
	for try := range MaxClaimTries {
		var a claimAnswer
		err := s.open(ctx, st, &a)
		a.judge(q.Tokens, token)
		if err != nil {
			if try == 0 {
				err = ClosedHandle(c.Op, err, e.Closed) // a closed pool or transaction
			}
			return Record{}, err
		}
		if a.claimed {
			if st != claim {
				c.Emit(ctx, EventTakeover, c.Op, key, a.attempt, time.Time{}, nil)
			}
			return Record{Claimed: true, Attempt: a.attempt, Status: StatusProcessing}, nil
		}
		rec, found, err := s.read(ctx, &a)
		if err != nil {
			return Record{}, err
		}
		if c.RequireIssued {
			if err := CheckToken(found, &rec); err != nil {
				return rec, err
			}
		}
		switch {
		case !found:
			st = claim // purged after the conflict: claim again
		case !rec.FingerprintMatches(key.Fingerprint):
			return rec, ErrKeyReused
		case rec.Takeable():
			takeover := append(append(make([]any, 0, 6), args[:4]...), rec.Attempt)
			if q.Tokens {
				takeover = append(takeover, token)
			}
			st = &claimStep{token: token, sql: q.Takeover, args: takeover, changes: true}
		case rec.Status == StatusProcessing:
			return rec, ErrInProgress
		default:
			return rec, nil // finished: replay it
		}
	}
	return Record{}, fmt.Errorf("idem: could not claim the key after %d tries (records vanishing under concurrent purges or takeovers)", MaxClaimTries)
}

// waitLeft is the time left before ctx's deadline, or -1 for none.
func waitLeft(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), 0)
	}
	return -1
}

// NewClaimToken returns a random claim token (Queries.Tokens).
func NewClaimToken() []byte {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // crypto/rand.Read never fails
	return b
}

// CleanupTimeout bounds the statements that undo work after fn failed.
const CleanupTimeout = 10 * time.Second

// CleanupContext keeps ctx's values but not its cancellation, so that work
// can still be undone after ctx was cancelled.
func CleanupContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), CleanupTimeout)
}
