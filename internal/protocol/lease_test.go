package protocol

import (
	"context"
	"errors"
	"testing"
	"time"
)

// leaseQuerier is a Querier that records the groups it is given and answers
// them with answer.
type leaseQuerier struct {
	inTx   bool
	groups [][]Stmt
	answer func(stmts []Stmt) error
}

func (q *leaseQuerier) Run(_ context.Context, stmts ...Stmt) error {
	q.groups = append(q.groups, stmts)
	return q.answer(stmts)
}

func (q *leaseQuerier) InTx() bool { return q.inTx }

var errLockTimeout = errors.New("lock timeout")

// leaseErrors knows errLockTimeout alone.
type leaseErrors struct{}

func (leaseErrors) Retryable(error) bool               { return false }
func (leaseErrors) LockTimeout(err error) bool         { return errors.Is(err, errLockTimeout) }
func (leaseErrors) Closed(error) (what string, _ bool) { return "", false }

func leaseConfig(t *testing.T) *Config {
	t.Helper()
	c, err := NewConfig(testDialect, []Option(nil))
	if err != nil {
		t.Fatal(err)
	}
	c.Op = "Claim"
	return &c
}

// claimed answers a claim group as a claim of attempt 1.
func claimed(stmts []Stmt) error {
	for _, st := range stmts {
		if st.Found != nil && len(st.Dest) == 3 {
			*st.Found = true
			*st.Dest[0].(*int32) = 1
		}
	}
	return nil
}

// Outside a transaction of the caller's, the claim's group sets the lock
// timeout first; inside one, it does not touch the caller's settings.
func TestClaimLockTimeoutOnlyOutsideATransaction(t *testing.T) {
	key := Key{Scope: "s", ID: "k"}
	for _, inTx := range []bool{false, true} {
		q := &leaseQuerier{inTx: inTx, answer: claimed}
		l, _, _, err := Claim[int](context.Background(), leaseErrors{}, q, key, time.Minute, leaseConfig(t))
		if err != nil || l.Attempt() != 1 {
			t.Fatalf("inTx %v: lease %v, err %v", inTx, l, err)
		}
		g := q.groups[0]
		set := g[0].SQL == testDialect.ClaimLockTimeout
		if set == inTx {
			t.Errorf("inTx %v: the group begins with %q %v", inTx, g[0].SQL, g[0].Args)
		}
		if want := 3 - btoi(inTx); len(g) != want {
			t.Errorf("inTx %v: %d statements, want %d", inTx, len(g), want)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A lock timeout is ErrInProgress for a claim that set it, and the
// caller's own error in the caller's transaction.
func TestClaimLockTimeoutIsInProgress(t *testing.T) {
	key := Key{Scope: "s", ID: "k"}
	for _, inTx := range []bool{false, true} {
		q := &leaseQuerier{inTx: inTx, answer: func([]Stmt) error { return errLockTimeout }}
		_, _, _, err := Claim[int](context.Background(), leaseErrors{}, q, key, time.Minute, leaseConfig(t))
		if got := errors.Is(err, ErrInProgress); got == inTx {
			t.Errorf("inTx %v: %v", inTx, err)
		}
	}
}

// A guarded statement that changes no row is ErrLeaseLost; one that changes
// the record renews the lease's clock.
func TestGuardedLeaseLost(t *testing.T) {
	key := Key{Scope: "s", ID: "k"}
	q := &leaseQuerier{answer: claimed}
	l, _, _, err := Claim[int](context.Background(), leaseErrors{}, q, key, time.Minute, leaseConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Usable(q); err != nil {
		t.Fatal(err)
	}
	rows := int64(1)
	q.answer = func(stmts []Stmt) error { *stmts[0].Affected = rows; return nil }
	before := l.renewed.Load()
	if err := l.Extend(context.Background(), q); err != nil {
		t.Fatal(err)
	}
	if l.renewed.Load() <= before {
		t.Error("Extend did not renew the lease's clock")
	}
	rows = 0
	err = l.Extend(context.Background(), q)
	if !errors.Is(err, ErrLeaseLost) || err.Error() != "idem: lease lost: the key is no longer held at attempt 1" {
		t.Errorf("Extend of a lost lease: %v", err)
	}
}

// A renewal known to have been sent later is never replaced by an earlier
// one that answered last.
func TestRenewedAtKeepsTheLatest(t *testing.T) {
	var l Lease[int]
	l.renewedAt(5)
	l.renewedAt(3)
	if got := l.renewed.Load(); got != 5 {
		t.Errorf("renewed = %d, want 5", got)
	}
	l.renewedAt(7)
	if got := l.renewed.Load(); got != 7 {
		t.Errorf("renewed = %d, want 7", got)
	}
}

// A nil or zero lease, and a nil handle, are refused.
func TestUsable(t *testing.T) {
	var nilLease *Lease[int]
	for name, err := range map[string]error{
		"nil handle": (&Lease[int]{cfg: Config{Q: testDialect.RecordsOf(DefaultRecords)}}).Usable(nil),
		"nil lease":  nilLease.Usable(&leaseQuerier{}),
		"zero lease": new(Lease[int]).Usable(&leaseQuerier{}),
	} {
		if !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v", name, err)
		}
	}
	ctx, stop := KeepAliveRefused(context.Background(), ErrInvalidOption)
	if !errors.Is(context.Cause(ctx), ErrInvalidOption) || !errors.Is(stop(), ErrInvalidOption) {
		t.Error("KeepAliveRefused: the context or stop does not carry the error")
	}
}
