package postgres

import (
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/protocol"
)

var placeholder = regexp.MustCompile(`\$(\d+)`)

// params returns the parameters a statement numbers.
func params(sql string) map[int]bool {
	used := map[int]bool{}
	for _, p := range placeholder.FindAllStringSubmatch(sql, -1) {
		n, _ := strconv.Atoi(p[1])
		used[n] = true
	}
	return used
}

// Every transition statement numbers exactly the parameters the protocol
// passes it (the id, the state asked for, the n states that may reach it,
// the values of sets, the expected version), and binds no array:
// database/sql's drivers cannot send a Go slice.
func TestTransitionNumbersItsArguments(t *testing.T) {
	for _, version := range []string{"", "version"} {
		for _, history := range []string{"", "order_history"} {
			q := machine(protocol.MachineNames{Table: protocol.Table{Schema: "shop", Name: "orders"},
				History: protocol.Table{Schema: "shop", Name: history}, ID: "id", State: "status", Version: version})
			for nFrom := range 4 {
				for _, sets := range [][]string{nil, {"paid_at", "payment_ref"}} {
					for _, expect := range []bool{false, version != ""} {
						sql := q.Transition(nFrom, sets, expect)
						want := 2 + nFrom + len(sets)
						if expect {
							want++
						}
						used := params(sql)
						for n := 1; n <= want; n++ {
							if !used[n] {
								t.Errorf("%d sources (version %q, history %q): $%d of %d unused in\n%s", nFrom, version, history, n, want, sql)
							}
						}
						if len(used) != want {
							t.Errorf("%d sources: %d parameters in the statement, want %d:\n%s", nFrom, len(used), want, sql)
						}
						if strings.Contains(sql, "[]") {
							t.Errorf("%d sources: an array parameter:\n%s", nFrom, sql)
						}
						if (history != "") != strings.Contains(sql, `"shop"."order_history"`) {
							t.Errorf("%d sources, history %q:\n%s", nFrom, history, sql)
						}
					}
				}
			}
		}
	}
}

// A table's names are quoted, schema-qualified when a schema is given, in
// every statement; the missing-table check matches PostgreSQL's message for
// that table only.
func TestRecordStatementsNameTheirTable(t *testing.T) {
	q := Dialect.RecordsOf(protocol.Table{Schema: "app", Name: "keys"})
	for name, sql := range map[string]string{"Claim": q.Claim, "Read": q.Read, "Complete": q.Complete,
		"Purge": q.Purge, "Stats": q.Stats, "LockTable": q.LockTable, "Lookup": q.Lookup} {
		if !strings.Contains(sql, `"app"."keys"`) {
			t.Errorf("%s does not name the table:\n%s", name, sql)
		}
	}
	if got := Dialect.RecordsOf(protocol.DefaultRecords).Table; got != `"idempotent_record"` {
		t.Errorf("default table %s", got)
	}
	missing := sqlError{code: "42P01", msg: `relation "app.keys" does not exist`}
	if !Dialect.MissingTable(missing, protocol.Table{Schema: "app", Name: "keys"}) {
		t.Error("the missing table was not recognised")
	}
	if Dialect.MissingTable(missing, protocol.Table{Name: "keys"}) ||
		Dialect.MissingTable(sqlError{code: "42703", msg: missing.msg}, protocol.Table{Schema: "app", Name: "keys"}) {
		t.Error("another table, or another error, was taken for the missing table")
	}
}

// sqlError is an error with a SQLSTATE, as both PostgreSQL drivers give one.
type sqlError struct{ code, msg string }

func (e sqlError) Error() string    { return e.msg }
func (e sqlError) SQLState() string { return e.code }
