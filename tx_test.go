package idem

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The types idem hands out in place of pgx's interfaces embed them, so that
// a method a pgx minor release adds to pgx.Tx, pgx.Rows or pgx.Row is
// promoted rather than missing, and idem still builds.
func TestPgxInterfacesAreEmbedded(t *testing.T) {
	for _, c := range []struct {
		typ   reflect.Type
		iface reflect.Type
	}{
		{reflect.TypeFor[guardTx](), reflect.TypeFor[pgx.Tx]()},
		{reflect.TypeFor[errRows](), reflect.TypeFor[pgx.Rows]()},
		{reflect.TypeFor[errRow](), reflect.TypeFor[pgx.Row]()},
	} {
		embedded := false
		for i := range c.typ.NumField() {
			f := c.typ.Field(i)
			embedded = embedded || (f.Anonymous && f.Type == c.iface)
		}
		if !embedded {
			t.Errorf("%v implements %v method by method: embed it", c.typ, c.iface)
		}
	}
}

// fakeTx is a transaction that records what reached it.
type fakeTx struct {
	pgx.Tx
	calls []string
}

func (f *fakeTx) Commit(context.Context) error   { f.calls = append(f.calls, "Commit"); return nil }
func (f *fakeTx) Rollback(context.Context) error { f.calls = append(f.calls, "Rollback"); return nil }
func (f *fakeTx) Begin(context.Context) (pgx.Tx, error) {
	f.calls = append(f.calls, "Begin")
	return &fakeTx{}, nil
}

// The guard refuses Commit and Rollback of the transaction fn received,
// lets a savepoint's through, and stops every method once closed.
func TestGuardTx(t *testing.T) {
	ctx := context.Background()
	inner := &fakeTx{}
	g := newGuard(inner)
	if err := g.Commit(ctx); !errors.Is(err, errTxOwned) {
		t.Fatalf("Commit: %v", err)
	}
	if err := g.Rollback(ctx); !errors.Is(err, errTxOwned) {
		t.Fatalf("Rollback: %v", err)
	}
	sp, err := g.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.Commit(ctx); err != nil {
		t.Fatalf("a savepoint's Commit: %v", err)
	}
	g.close()
	if _, err := g.Exec(ctx, "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("Exec after close: %v", err)
	}
	rows, err := g.Query(ctx, "SELECT 1")
	if !errors.Is(err, pgx.ErrTxClosed) || rows.Next() || !errors.Is(rows.Err(), pgx.ErrTxClosed) {
		t.Fatalf("Query after close: %v", err)
	}
	rows.Close()
	if err := g.QueryRow(ctx, "SELECT 1").Scan(); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("QueryRow after close: %v", err)
	}
	if err := sp.Rollback(ctx); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("a savepoint's Rollback after close: %v", err)
	}
	if want := []string{"Begin"}; !reflect.DeepEqual(inner.calls, want) {
		t.Fatalf("reached the transaction: %v, want %v", inner.calls, want)
	}
}
