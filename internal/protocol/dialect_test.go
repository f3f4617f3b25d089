package protocol

import "testing"

// testDialect names each statement after its role, so that a test of the
// protocol's decisions can tell which one a driver was given.
var testDialect = &Dialect{
	Name: "test",
	Records: func(t Table) *Queries {
		return &Queries{Table: t.String(), Claim: "claim", ClaimIssued: "claim issued", Takeover: "takeover",
			Issue: "issue", LeaseClaim: "lease claim", LeaseClaimIssued: "lease claim issued",
			LeaseUpdate: "lease update", LeaseCheckpoint: "lease checkpoint", LeaseFinish: "lease finish",
			LeaseRelease: "lease release", Read: "read", Complete: "complete", Release: "release"}
	},
	Inbox:   func(t Table) *InboxQueries { return &InboxQueries{Table: t.String(), Insert: "inbox insert"} },
	Machine: func(MachineNames) MachineQueries { return testMachine{} },
	Statements: Statements{ClaimLockTimeout: "claim lock timeout", NoWaitSet: "no-wait set",
		NoWaitRestore: "no-wait restore", HoldSet: "hold set"},
}

type testMachine struct{}

func (testMachine) Read() string                          { return "machine read" }
func (testMachine) Transition(int, []string, bool) string { return "machine transition" }
func (testMachine) HistoryDDL(string) string              { return "machine history" }
func (testMachine) LockRead() string                      { return "" }
func (testMachine) HistoryInsert() string                 { return "" }

// A table's statements are built once per dialect; the defaults come
// without a lookup, any other table from the cache.
func TestDialectBuildsEachTableOnce(t *testing.T) {
	built := 0
	d := &Dialect{Records: func(t Table) *Queries { built++; return &Queries{Table: t.String()} },
		Inbox: func(t Table) *InboxQueries { return &InboxQueries{Table: t.String()} }}
	other := Table{Schema: "app", Name: "keys"}
	if d.RecordsOf(DefaultRecords) != d.RecordsOf(DefaultRecords) || d.RecordsOf(other) != d.RecordsOf(other) {
		t.Fatal("a table's statements were built again")
	}
	if built != 2 {
		t.Errorf("built %d times, want 2", built)
	}
	if got := d.RecordsOf(other).Table; got != "app.keys" {
		t.Errorf("table %q", got)
	}
	if got := d.InboxOf(DefaultInbox).Table; got != DefaultInboxTable {
		t.Errorf("inbox table %q", got)
	}
}
