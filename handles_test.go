package idem_test

import (
	"context"
	"database/sql"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemhttp"
	"github.com/idemkit/idem/idemmysql"
	"github.com/idemkit/idem/idemsql"
	"github.com/idemkit/idem/migrations"
	mysqlmigrations "github.com/idemkit/idem/migrations/mysql"
)

// handlePackages are the packages whose exported functions take database
// handles, with the name each is known by in handleCalls.
var handlePackages = map[string]string{".": "idem", "idemhttp": "idemhttp", "idemsql": "idemsql", "idemmysql": "idemmysql", "migrations": "migrations", "migrations/mysql": "mysqlmigrations"}

// handleTypes are the parameter and field types, as written in the source,
// that carry a database handle.
var handleTypes = []string{
	"DBTX", "TxBeginner", "pgx.Tx", "idem.DBTX", "idem.TxBeginner",
	"*pgxpool.Pool", "*pgx.Conn", "*sql.DB", "*sql.Tx", "D",
}

// takesHandles lists every exported function, method and struct field of
// handlePackages that takes a database handle, as "pkg.Func",
// "pkg.Type.Method" or "pkg.Type.Field", by reading the source, so that a
// new entry point cannot be left out of handleCalls.
func takesHandles(t *testing.T) []string {
	t.Helper()
	var names []string
	isHandle := func(e ast.Expr) bool { return slices.Contains(handleTypes, types.ExprString(e)) }
	for dir, pkg := range handlePackages {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.SkipObjectResolution)
			require.NoError(t, err)
			for _, decl := range f.Decls {
				switch d := decl.(type) {
				case *ast.FuncDecl:
					if !d.Name.IsExported() {
						continue
					}
					name := pkg + "." + d.Name.Name
					if d.Recv != nil {
						recv := receiverName(d.Recv.List[0].Type)
						if !ast.IsExported(recv) {
							continue
						}
						name = pkg + "." + recv + "." + d.Name.Name
					}
					for _, p := range d.Type.Params.List {
						if isHandle(p.Type) {
							names = append(names, name)
							break
						}
					}
				case *ast.GenDecl:
					for _, spec := range d.Specs {
						ts, ok := spec.(*ast.TypeSpec)
						if !ok || !ts.Name.IsExported() {
							continue
						}
						st, ok := ts.Type.(*ast.StructType)
						if !ok {
							continue
						}
						for _, field := range st.Fields.List {
							for _, n := range field.Names {
								if n.IsExported() && isHandle(field.Type) {
									names = append(names, pkg+"."+ts.Name.Name+"."+n.Name)
								}
							}
						}
					}
				}
			}
		}
	}
	slices.Sort(names)
	return names
}

// receiverName is a method's receiver type without its pointer and type
// parameters: Lease for *Lease[T].
func receiverName(e ast.Expr) string {
	if s, ok := e.(*ast.StarExpr); ok {
		e = s.X
	}
	switch x := e.(type) {
	case *ast.IndexExpr:
		e = x.X
	case *ast.IndexListExpr:
		e = x.X
	}
	return types.ExprString(e)
}

// The nil handles a caller can pass by mistake: an untyped nil, and the
// typed nils of a variable declared and never assigned.
var (
	nilDBTX      = []any{nil, (*pgxpool.Pool)(nil), (*pgx.Conn)(nil), (*pgxpool.Conn)(nil), (*pgxpool.Tx)(nil)}
	nilBeginners = []any{nil, (*pgxpool.Pool)(nil), (*pgx.Conn)(nil), (*pgxpool.Conn)(nil), (*pgxpool.Tx)(nil)}
	nilTxs       = []any{nil, (*pgxpool.Tx)(nil)}
)

// as converts h to T, giving T's zero value (a nil interface) for nil.
func as[T any](h any) T {
	v, _ := h.(T)
	return v
}

// handleCall is how an entry point is called with a handle h.
type handleCall struct {
	handles []any
	call    func(h any) error
}

// handleCalls calls every entry point of takesHandles with a handle and
// otherwise valid arguments.
func handleCalls(t *testing.T) map[string]handleCall {
	ctx := context.Background()
	key := idem.Key{Scope: "user:1", ID: "k"}
	fn := func(context.Context, pgx.Tx) (int, error) {
		t.Error("fn ran")
		return 0, nil
	}
	sqlFn := func(context.Context, *sql.Tx) (int, error) {
		t.Error("fn ran")
		return 0, nil
	}
	machine, err := idem.NewStateMachine(idem.StateMachineConfig{
		Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID"}, Transitions: map[string][]string{"PENDING": {"PAID"}},
	})
	require.NoError(t, err)
	sqlMachine, err := idemsql.NewStateMachine(idem.StateMachineConfig{
		Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID"}, Transitions: map[string][]string{"PENDING": {"PAID"}},
	})
	require.NoError(t, err)
	myMachine, err := idemmysql.NewStateMachine(idem.StateMachineConfig{
		Table: "orders", IDColumn: "id", StateColumn: "status",
		States: []string{"PENDING", "PAID"}, Transitions: map[string][]string{"PENDING": {"PAID"}},
	})
	require.NoError(t, err)
	myOps := func(call func(db idemmysql.DBTX) error) handleCall {
		return handleCall{[]any{nil, (*sql.DB)(nil), (*sql.Tx)(nil), (*sql.Conn)(nil)}, func(h any) error { return call(as[idemmysql.DBTX](h)) }}
	}
	myLease := new(idemmysql.Lease[int])
	lease := new(idem.Lease[int])
	sqlLease := new(idemsql.Lease[int])
	sqlLeaseDB := func(call func(db idemsql.DBTX) error) handleCall {
		return handleCall{[]any{nil, (*sql.DB)(nil), (*sql.Tx)(nil), (*sql.Conn)(nil)}, func(h any) error { return call(as[idemsql.DBTX](h)) }}
	}
	ins := idem.Query{SQL: "INSERT INTO t VALUES (1) ON CONFLICT DO NOTHING RETURNING 1"}
	get := idem.Query{SQL: "SELECT 1 FROM t"}
	var dest int
	dbtx := func(call func(db idem.DBTX) error) handleCall {
		return handleCall{nilDBTX, func(h any) error { return call(as[idem.DBTX](h)) }}
	}
	beginner := func(call func(db idem.TxBeginner) error) handleCall {
		return handleCall{nilBeginners, func(h any) error { return call(as[idem.TxBeginner](h)) }}
	}
	inTx := func(call func(tx pgx.Tx) error) handleCall {
		return handleCall{nilTxs, func(h any) error { return call(as[pgx.Tx](h)) }}
	}
	// migrate calls a migrations function with a nil pool and a nil conn.
	migrate := func(pool func(*pgxpool.Pool) error, conn func(*pgx.Conn) error) handleCall {
		return handleCall{[]any{(*pgxpool.Pool)(nil), (*pgx.Conn)(nil)}, func(h any) error {
			if p, ok := h.(*pgxpool.Pool); ok {
				return pool(p)
			}
			return conn(h.(*pgx.Conn))
		}}
	}
	// sqlOps calls a Purge or inspection call of idemsql with its nil
	// handles.
	sqlOps := func(call func(db idemsql.DBTX) error) handleCall {
		return handleCall{[]any{nil, (*sql.DB)(nil), (*sql.Tx)(nil), (*sql.Conn)(nil)}, func(h any) error { return call(as[idemsql.DBTX](h)) }}
	}
	return map[string]handleCall{
		"idem.Do": beginner(func(db idem.TxBeginner) error { _, err := idem.Do(ctx, db, key, fn); return err }),
		"idem.WithIdempotency": inTx(func(tx pgx.Tx) error {
			_, err := idem.WithIdempotency(ctx, tx, key, fn)
			return err
		}),
		"idem.Claim":           dbtx(func(db idem.DBTX) error { _, _, err := idem.Claim[int](ctx, db, key, time.Minute); return err }),
		"idem.Lease.Extend":    dbtx(func(db idem.DBTX) error { return lease.Extend(ctx, db) }),
		"idem.Lease.KeepAlive": dbtx(func(db idem.DBTX) error { _, stop := lease.KeepAlive(ctx, db); return stop() }),
		"idem.Lease.Checkpoint": dbtx(func(db idem.DBTX) error {
			return lease.Checkpoint(ctx, db, "charging", nil)
		}),
		"idem.Lease.Complete": dbtx(func(db idem.DBTX) error { return lease.Complete(ctx, db, 1) }),
		"idem.Lease.Fail":     dbtx(func(db idem.DBTX) error { return lease.Fail(ctx, db, errors.New("declined")) }),
		"idem.Lease.Release":  dbtx(func(db idem.DBTX) error { return lease.Release(ctx, db) }),
		"idem.IssueToken": dbtx(func(db idem.DBTX) error {
			_, err := idem.IssueToken(ctx, db, "user:1", time.Minute)
			return err
		}),
		"idem.StateMachine.Transition": dbtx(func(db idem.DBTX) error {
			_, err := machine.Transition(ctx, db, 1, "PAID")
			return err
		}),
		"idem.InsertOrGet": dbtx(func(db idem.DBTX) error { _, err := idem.InsertOrGet(ctx, db, ins, get, &dest); return err }),
		"idem.InsertOrGetTx": inTx(func(tx pgx.Tx) error {
			_, err := idem.InsertOrGetTx(ctx, tx, ins, get, &dest)
			return err
		}),
		"idem.ConsumeOnce": inTx(func(tx pgx.Tx) error {
			_, err := idem.ConsumeOnce(ctx, tx, "c", "m-1", func(context.Context, pgx.Tx) error {
				t.Error("fn ran")
				return nil
			})
			return err
		}),
		"idem.Lookup":       dbtx(func(db idem.DBTX) error { _, err := idem.Lookup(ctx, db, "s", "k"); return err }),
		"idem.Stuck":        dbtx(func(db idem.DBTX) error { _, err := idem.Stuck(ctx, db, 10); return err }),
		"idem.CountExpired": dbtx(func(db idem.DBTX) error { _, _, err := idem.CountExpired(ctx, db, time.Hour); return err }),
		"idem.TableStats":   dbtx(func(db idem.DBTX) error { _, err := idem.TableStats(ctx, db); return err }),
		"idem.Purge":        dbtx(func(db idem.DBTX) error { _, err := idem.Purge(ctx, db, idem.PurgeParams{}); return err }),
		"idem.Purger.DB":    dbtx(func(db idem.DBTX) error { return (&idem.Purger{DB: db}).Run(ctx) }),
		"idemhttp.Middleware": beginner(func(db idem.TxBeginner) error {
			_, err := idemhttp.Middleware(db, idemhttp.Config{Scope: func(*http.Request) (string, error) { return "u", nil }})
			return err
		}),
		"idemhttp.Pgx": beginner(func(db idem.TxBeginner) error {
			_, err := idemhttp.New(idemhttp.Pgx(db), idemhttp.Config{Scope: func(*http.Request) (string, error) { return "u", nil }})
			return err
		}),
		"idemhttp.SQL": {[]any{(*sql.DB)(nil)}, func(h any) error {
			_, err := idemhttp.New(idemhttp.SQL(h.(*sql.DB)), idemhttp.Config{Scope: func(*http.Request) (string, error) { return "u", nil }})
			return err
		}},
		"idemhttp.MySQL": {[]any{(*sql.DB)(nil)}, func(h any) error {
			_, err := idemhttp.New(idemhttp.MySQL(h.(*sql.DB)), idemhttp.Config{Scope: func(*http.Request) (string, error) { return "u", nil }})
			return err
		}},
		"idemmysql.Do": {[]any{(*sql.DB)(nil)}, func(h any) error {
			_, err := idemmysql.Do(ctx, h.(*sql.DB), key, sqlFn)
			return err
		}},
		"idemmysql.WithIdempotency": {[]any{(*sql.Tx)(nil)}, func(h any) error {
			_, err := idemmysql.WithIdempotency(ctx, h.(*sql.Tx), key, sqlFn)
			return err
		}},
		"idemmysql.ConsumeOnce": {[]any{(*sql.Tx)(nil)}, func(h any) error {
			_, err := idemmysql.ConsumeOnce(ctx, h.(*sql.Tx), "c", "m-1", func(context.Context, *sql.Tx) error {
				t.Error("fn ran")
				return nil
			})
			return err
		}},
		"idemmysql.Migrate":    {[]any{(*sql.DB)(nil)}, func(h any) error { return idemmysql.Migrate(ctx, h.(*sql.DB)) }},
		"mysqlmigrations.Up":   {[]any{(*sql.DB)(nil)}, func(h any) error { return mysqlmigrations.Up(ctx, h.(*sql.DB)) }},
		"mysqlmigrations.Down": {[]any{(*sql.DB)(nil)}, func(h any) error { return mysqlmigrations.Down(ctx, h.(*sql.DB)) }},
		"idemmysql.StateMachine.Transition": {[]any{nil, (*sql.DB)(nil), (*sql.Tx)(nil), (*sql.Conn)(nil)}, func(h any) error {
			_, err := myMachine.Transition(ctx, as[idemmysql.DBTX](h), 1, "PAID")
			return err
		}},
		"idemsql.Do": {[]any{(*sql.DB)(nil)}, func(h any) error {
			_, err := idemsql.Do(ctx, h.(*sql.DB), key, sqlFn)
			return err
		}},
		"idemsql.Claim": sqlLeaseDB(func(db idemsql.DBTX) error {
			_, _, err := idemsql.Claim[int](ctx, db, key, time.Minute)
			return err
		}),
		"idemsql.Lease.Extend":    sqlLeaseDB(func(db idemsql.DBTX) error { return sqlLease.Extend(ctx, db) }),
		"idemsql.Lease.KeepAlive": sqlLeaseDB(func(db idemsql.DBTX) error { _, stop := sqlLease.KeepAlive(ctx, db); return stop() }),
		"idemsql.Lease.Checkpoint": sqlLeaseDB(func(db idemsql.DBTX) error {
			return sqlLease.Checkpoint(ctx, db, "charging", nil)
		}),
		"idemsql.Lease.Complete": sqlLeaseDB(func(db idemsql.DBTX) error { return sqlLease.Complete(ctx, db, 1) }),
		"idemsql.Lease.Fail":     sqlLeaseDB(func(db idemsql.DBTX) error { return sqlLease.Fail(ctx, db, errors.New("declined")) }),
		"idemsql.Lease.Release":  sqlLeaseDB(func(db idemsql.DBTX) error { return sqlLease.Release(ctx, db) }),
		"idemsql.IssueToken": sqlLeaseDB(func(db idemsql.DBTX) error {
			_, err := idemsql.IssueToken(ctx, db, "user:1", time.Minute)
			return err
		}),
		"idemsql.WithIdempotency": {[]any{(*sql.Tx)(nil)}, func(h any) error {
			_, err := idemsql.WithIdempotency(ctx, h.(*sql.Tx), key, sqlFn)
			return err
		}},
		"idemsql.ConsumeOnce": {[]any{(*sql.Tx)(nil)}, func(h any) error {
			_, err := idemsql.ConsumeOnce(ctx, h.(*sql.Tx), "c", "m-1", func(context.Context, *sql.Tx) error {
				t.Error("fn ran")
				return nil
			})
			return err
		}},
		"idemsql.InsertOrGet": sqlOps(func(db idemsql.DBTX) error { _, err := idemsql.InsertOrGet(ctx, db, ins, get, &dest); return err }),
		"idemsql.InsertOrGetTx": {[]any{(*sql.Tx)(nil)}, func(h any) error {
			_, err := idemsql.InsertOrGetTx(ctx, h.(*sql.Tx), ins, get, &dest)
			return err
		}},
		"idemsql.StateMachine.Transition": {[]any{nil, (*sql.DB)(nil), (*sql.Tx)(nil), (*sql.Conn)(nil)}, func(h any) error {
			_, err := sqlMachine.Transition(ctx, as[idemsql.DBTX](h), 1, "PAID")
			return err
		}},
		"idemsql.Lookup":        sqlOps(func(db idemsql.DBTX) error { _, err := idemsql.Lookup(ctx, db, "s", "k"); return err }),
		"idemsql.Stuck":         sqlOps(func(db idemsql.DBTX) error { _, err := idemsql.Stuck(ctx, db, 10); return err }),
		"idemsql.CountExpired":  sqlOps(func(db idemsql.DBTX) error { _, _, err := idemsql.CountExpired(ctx, db, time.Hour); return err }),
		"idemsql.TableStats":    sqlOps(func(db idemsql.DBTX) error { _, err := idemsql.TableStats(ctx, db); return err }),
		"idemsql.Purge":         sqlOps(func(db idemsql.DBTX) error { _, err := idemsql.Purge(ctx, db, idem.PurgeParams{}); return err }),
		"idemmysql.InsertOrGet": myOps(func(db idemmysql.DBTX) error { _, err := idemmysql.InsertOrGet(ctx, db, ins, get, &dest); return err }),
		"idemmysql.IssueToken":  myOps(func(db idemmysql.DBTX) error { _, err := idemmysql.IssueToken(ctx, db, "s", time.Hour); return err }),
		"idemmysql.Claim": myOps(func(db idemmysql.DBTX) error {
			_, _, err := idemmysql.Claim[int](ctx, db, key, time.Minute)
			return err
		}),
		"idemmysql.Lease.Extend":     myOps(func(db idemmysql.DBTX) error { return myLease.Extend(ctx, db) }),
		"idemmysql.Lease.KeepAlive":  myOps(func(db idemmysql.DBTX) error { _, stop := myLease.KeepAlive(ctx, db); return stop() }),
		"idemmysql.Lease.Checkpoint": myOps(func(db idemmysql.DBTX) error { return myLease.Checkpoint(ctx, db, "p", 1) }),
		"idemmysql.Lease.Complete":   myOps(func(db idemmysql.DBTX) error { return myLease.Complete(ctx, db, 1) }),
		"idemmysql.Lease.Fail":       myOps(func(db idemmysql.DBTX) error { return myLease.Fail(ctx, db, errors.New("declined")) }),
		"idemmysql.Lease.Release":    myOps(func(db idemmysql.DBTX) error { return myLease.Release(ctx, db) }),
		"idemmysql.Lookup":           myOps(func(db idemmysql.DBTX) error { _, err := idemmysql.Lookup(ctx, db, "s", "k"); return err }),
		"idemmysql.Stuck":            myOps(func(db idemmysql.DBTX) error { _, err := idemmysql.Stuck(ctx, db, 1); return err }),
		"idemmysql.TableStats":       myOps(func(db idemmysql.DBTX) error { _, err := idemmysql.TableStats(ctx, db); return err }),
		"idemmysql.CountExpired":     myOps(func(db idemmysql.DBTX) error { _, _, err := idemmysql.CountExpired(ctx, db, time.Hour); return err }),
		"idemmysql.Purge":            myOps(func(db idemmysql.DBTX) error { _, err := idemmysql.Purge(ctx, db, idem.PurgeParams{}); return err }),
		"idemmysql.Purger.DB": {[]any{(*sql.DB)(nil)}, func(h any) error {
			return (&idemmysql.Purger{DB: h.(*sql.DB)}).Run(ctx)
		}},
		"idemsql.Purger.DB": {[]any{(*sql.DB)(nil)}, func(h any) error {
			return (&idemsql.Purger{DB: h.(*sql.DB)}).Run(ctx)
		}},
		"migrations.Up": migrate(func(p *pgxpool.Pool) error { return migrations.Up(ctx, p) },
			func(c *pgx.Conn) error { return migrations.Up(ctx, c) }),
		"migrations.Down": migrate(func(p *pgxpool.Pool) error { return migrations.Down(ctx, p) },
			func(c *pgx.Conn) error { return migrations.Down(ctx, c) }),
		"migrations.Force": migrate(func(p *pgxpool.Pool) error { return migrations.Force(ctx, p, 1) },
			func(c *pgx.Conn) error { return migrations.Force(ctx, c, 1) }),
		"migrations.Version": migrate(func(p *pgxpool.Pool) error { _, _, err := migrations.Version(ctx, p); return err },
			func(c *pgx.Conn) error { _, _, err := migrations.Version(ctx, c); return err }),
	}
}

// Every exported function, method and field that takes a database handle
// answers a nil or typed-nil one (a *pgxpool.Pool declared and never
// assigned) with ErrInvalidOption, before any SQL and without a panic.
func TestNilHandlesAreRefused(t *testing.T) {
	t.Parallel()
	calls := handleCalls(t)
	found := takesHandles(t)
	require.NotEmpty(t, found)
	for _, name := range found {
		if _, ok := calls[name]; !ok {
			t.Errorf("%s takes a database handle: add it to handleCalls", name)
		}
	}
	for name, c := range calls {
		if !slices.Contains(found, name) {
			t.Errorf("handleCalls has %s, which takes no database handle (renamed?)", name)
			continue
		}
		for _, h := range c.handles {
			var err error
			if assert.NotPanics(t, func() { err = c.call(h) }, "%s(%T)", name, h) {
				assert.ErrorIs(t, err, idem.ErrInvalidOption, "%s(%T)", name, h)
			}
		}
	}
}

// A pool the application has closed, and a transaction it has already
// committed, are answered with an error that says so in idem's words,
// through every entry point that takes them.
func TestClosedHandlesAreExplained(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// No connection is made: the pool is closed before its first use.
	pool, err := pgxpool.New(ctx, "postgres://idem@127.0.0.1:1/none?connect_timeout=1")
	require.NoError(t, err)
	pool.Close()
	calls := handleCalls(t)
	for name, c := range calls {
		switch {
		case !slices.Contains(c.handles, any((*pgxpool.Pool)(nil))), strings.HasPrefix(name, "idemsql."):
			continue // takes no pool
		case strings.HasPrefix(name, "idem.Lease."), name == "idem.Purger.DB", name == "idemhttp.Middleware", name == "idemhttp.Pgx",
			strings.HasPrefix(name, "migrations."):
			// A zero Lease is refused before its db is used; the Purger
			// runs Purge until ctx ends; the middleware uses its pool per
			// request; migrations open a connection of their own with the
			// pool's settings, closed or not.
			continue
		}
		var err error
		if !assert.NotPanics(t, func() { err = c.call(pool) }, name) {
			continue
		}
		if assert.ErrorContains(t, err, "closed pool", name) {
			assert.Regexp(t, `^(idem|migrations)\b`, err.Error(), name)
		}
	}
}
