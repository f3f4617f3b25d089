package mysql

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemkit/idem/internal/protocol"
)

func TestBindOrdersTheArguments(t *testing.T) {
	q, args := Bind(`UPDATE t SET a = $3, b = $1 + INTERVAL $3 MICROSECOND WHERE k = $1 AND x = $10`,
		[]any{"k", "unused", 7, 4, 5, 6, 7, 8, 9, "ten"})
	if q != `UPDATE t SET a = ?, b = ? + INTERVAL ? MICROSECOND WHERE k = ? AND x = ?` {
		t.Errorf("query %s", q)
	}
	if fmt.Sprint(args) != "[7 k 7 k ten]" {
		t.Errorf("args %v", args)
	}
	if q, args := Bind(`SELECT 1`, nil); q != `SELECT 1` || len(args) != 0 {
		t.Errorf("no parameters: %q %v", q, args)
	}
}

// Every claiming statement binds what the protocol passes: Claim and
// ClaimIssued $1..$5 (the token last), Takeover $1..$6; the claim's read
// uses the key alone.
func TestClaimStatementsBindTheToken(t *testing.T) {
	for _, d := range []*protocol.Dialect{MariaDB, MySQL8} {
		q := d.RecordsOf(protocol.Table{Schema: "app", Name: "keys"})
		for name, c := range map[string]struct {
			sql  string
			want int
		}{"Claim": {q.Claim, 5}, "ClaimIssued": {q.ClaimIssued, 5}, "Takeover": {q.Takeover, 6}} {
			b := rewrite(c.sql)
			top := 0
			for _, n := range b.args {
				top = max(top, n+1)
			}
			if top != c.want || !strings.Contains(c.sql, "`app`.`keys`") {
				t.Errorf("%s %s: highest parameter $%d, want $%d:\n%s", d.Name, name, top, c.want, c.sql)
			}
		}
		if !strings.HasSuffix(q.ClaimRead, "FOR UPDATE") || !strings.HasSuffix(q.Read, "FOR UPDATE") {
			t.Errorf("%s: a record read that does not lock", d.Name)
		}
		if strings.Contains(q.Claim, "RETURNING") != q.ClaimReturns || q.ClaimReturns != (d == MariaDB) {
			t.Errorf("%s: RETURNING %v", d.Name, q.ClaimReturns)
		}
		if strings.Contains(q.Claim, "IGNORE") {
			t.Errorf("%s: INSERT IGNORE", d.Name)
		}
	}
}

func TestClaimPrefix(t *testing.T) {
	for _, c := range []struct {
		noWait bool
		wait   time.Duration
		want   string
	}{
		{false, -1, ""},
		{true, -1, "SET STATEMENT innodb_lock_wait_timeout = 0 FOR "},
		{false, 1500 * time.Millisecond, "SET STATEMENT max_statement_time = 1.600 FOR "},
		{true, 0, "SET STATEMENT innodb_lock_wait_timeout = 0, max_statement_time = 0.100 FOR "},
	} {
		if got := claimPrefix(c.noWait, c.wait); got != c.want {
			t.Errorf("%v %v: %q, want %q", c.noWait, c.wait, got, c.want)
		}
	}
	if MySQL8.ClaimPrefix != nil {
		t.Error("MySQL 8 has no SET STATEMENT")
	}
}

func TestErrors(t *testing.T) {
	deadlock := fmt.Errorf("claim: %w", &mysql.MySQLError{Number: 1213, Message: "Deadlock found"})
	if !Aborted(deadlock) || !Aborted(&mysql.MySQLError{Number: 1020}) || Aborted(&mysql.MySQLError{Number: 1205}) || Aborted(errors.New("x")) {
		t.Error("Aborted")
	}
	missing := &mysql.MySQLError{Number: 1146, Message: "Table 'test.idem_inbox' doesn't exist"}
	if !MariaDB.MissingTable(missing, protocol.DefaultInbox) || MariaDB.MissingTable(missing, protocol.DefaultRecords) ||
		!MariaDB.MissingTable(missing, protocol.Table{Schema: "test", Name: "idem_inbox"}) {
		t.Error("MissingTable")
	}
	if !MariaDB.Unique(&mysql.MySQLError{Number: 1062}) {
		t.Error("Unique")
	}
}
