package protocol

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

func ordersMachine(t *testing.T, version, history string) *Machine {
	t.Helper()
	m, err := NewMachine(testDialect, MachineConfig{
		Schema: "shop", Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID", "SHIPPED", "CANCELLED", "REFUNDED", "LOST"},
		Transitions: map[string][]string{
			"PENDING": {"PAID", "CANCELLED"},
			"PAID":    {"SHIPPED", "REFUNDED"},
			"SHIPPED": {"REFUNDED"},
		},
		VersionColumn: version, HistoryTable: history,
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// fakeQuerier answers each statement with rows[i]: the values copied into
// Dest, or no row for nil.
type fakeQuerier struct {
	rows  [][]any
	stmts []Stmt
}

func (f *fakeQuerier) InTx() bool { return false }

func (f *fakeQuerier) Run(_ context.Context, stmts ...Stmt) error {
	for _, st := range stmts {
		if len(f.rows) == 0 {
			return errors.New("unexpected statement: " + st.SQL)
		}
		row := f.rows[0]
		f.rows = f.rows[1:]
		f.stmts = append(f.stmts, st)
		if row == nil {
			if st.Found == nil {
				return errors.New("no rows")
			}
			*st.Found = false
			continue
		}
		if st.Found != nil {
			*st.Found = true
		}
		for i, v := range row {
			switch d := st.Dest[i].(type) {
			case *bool:
				*d = v.(bool)
			case **string:
				if v != nil {
					s := v.(string)
					*d = &s
				}
			case **int64:
				if v != nil {
					n := int64(v.(int))
					*d = &n
				}
			default:
				return fmt.Errorf("dest %T", d)
			}
		}
	}
	return nil
}

func noClosed(error) (string, bool) { return "", false }

// The decisions on what the statements found.
func TestTransitionDecisions(t *testing.T) {
	ctx := context.Background()
	m := ordersMachine(t, "version", "order_history")
	expect := func(v int64) *TransitionCall {
		c := &TransitionCall{}
		c.ExpectVersion(v)
		return c
	}
	tests := []struct {
		name  string
		to    string
		call  *TransitionCall
		rows  [][]any
		want  TransitionResult
		err   error // matched with errors.Is
		stmts int
	}{
		{"single applied", "PAID", nil, [][]any{{3}}, TransitionResult{From: "PENDING", To: "PAID", Applied: true, Version: 3}, nil, 1},
		{"single repeat", "PAID", nil, [][]any{nil, {"PAID", 3}}, TransitionResult{From: "PAID", To: "PAID", Version: 3}, nil, 2},
		{"single refused", "PAID", nil, [][]any{nil, {"SHIPPED", 5}}, TransitionResult{From: "SHIPPED", To: "PAID", Version: 5}, ErrInvalidTransition, 2},
		{"single not found", "PAID", nil, [][]any{nil, nil}, TransitionResult{To: "PAID"}, ErrNotFound, 2},
		{"multi applied", "REFUNDED", nil, [][]any{{true, "SHIPPED", true, "SHIPPED", 4}}, TransitionResult{From: "SHIPPED", To: "REFUNDED", Applied: true, Version: 4}, nil, 1},
		{"multi repeat", "REFUNDED", nil, [][]any{{true, "REFUNDED", false, nil, 4}}, TransitionResult{From: "REFUNDED", To: "REFUNDED", Version: 4}, nil, 1},
		{"multi not found", "REFUNDED", nil, [][]any{{false, nil, false, nil, nil}}, TransitionResult{To: "REFUNDED"}, ErrNotFound, 1},
		{"unreachable state", "LOST", nil, [][]any{{true, "PAID", false, nil, 1}}, TransitionResult{From: "PAID", To: "LOST", Version: 1}, ErrInvalidTransition, 1},
		{"own write repeated", "PAID", expect(2), [][]any{nil, {"PAID", 3}}, TransitionResult{From: "PAID", To: "PAID", Version: 3}, nil, 2},
		{"version conflict", "PAID", expect(2), [][]any{nil, {"PENDING", 5}}, TransitionResult{From: "PENDING", To: "PAID", Version: 5}, ErrVersionConflict, 2},
		{"right version, wrong state", "PAID", expect(5), [][]any{nil, {"SHIPPED", 5}}, TransitionResult{From: "SHIPPED", To: "PAID", Version: 5}, ErrInvalidTransition, 2},
	}
	for _, tt := range tests {
		q := &fakeQuerier{rows: tt.rows}
		res, err := m.Transition(ctx, q, noClosed, 9, tt.to, tt.call)
		if res != tt.want {
			t.Errorf("%s: %+v, want %+v", tt.name, res, tt.want)
		}
		if tt.err == nil && err != nil || tt.err != nil && !errors.Is(err, tt.err) {
			t.Errorf("%s: error %v, want %v", tt.name, err, tt.err)
		}
		if len(q.stmts) != tt.stmts || len(q.rows) != 0 {
			t.Errorf("%s: %d statements, want %d", tt.name, len(q.stmts), tt.stmts)
		}
	}
	var te *TransitionError
	_, err := m.Transition(ctx, &fakeQuerier{rows: [][]any{nil, {"PENDING", 5}}}, noClosed, 9, "PAID", expect(2))
	if !errors.As(err, &te) || te.CurrentVersion != 5 || te.ExpectedVersion != 2 || !errors.Is(err, ErrInvalidTransition) {
		t.Errorf("version conflict: %#v", err)
	}
	if want := `idem: row 9 is at version 5 (state "PENDING"), not 2: cannot move it to "PAID"`; err.Error() != want {
		t.Errorf("version conflict: %q, want %q", err, want)
	}
}

// What Transition refuses before any SQL.
func TestTransitionRefusesBeforeSQL(t *testing.T) {
	ctx := context.Background()
	m := ordersMachine(t, "", "")
	set := func(col string) *TransitionCall { c := &TransitionCall{}; c.Set(col, 1); return c }
	for name, run := range map[string]func(q Querier) error{
		"nil machine": func(q Querier) error {
			_, err := (*Machine)(nil).Transition(ctx, q, noClosed, 1, "PAID", nil)
			return err
		},
		"unknown state": func(q Querier) error { _, err := m.Transition(ctx, q, noClosed, 1, "GONE", nil); return err },
		"no querier":    func(Querier) error { _, err := m.Transition(ctx, nil, noClosed, 1, "PAID", nil); return err },
		"bad column":    func(q Querier) error { _, err := m.Transition(ctx, q, noClosed, 1, "PAID", set("a b")); return err },
		"state column":  func(q Querier) error { _, err := m.Transition(ctx, q, noClosed, 1, "PAID", set("status")); return err },
		"no version": func(q Querier) error {
			c := &TransitionCall{}
			c.ExpectVersion(1)
			_, err := m.Transition(ctx, q, noClosed, 1, "PAID", c)
			return err
		},
	} {
		q := &fakeQuerier{}
		if err := run(q); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
		if len(q.stmts) != 0 {
			t.Errorf("%s: ran SQL", name)
		}
	}
}
