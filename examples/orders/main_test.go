package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/idemkit/idem/examples/internal/exampletest"
)

// The tests leave no schema behind (see exampletest.Main).
func TestMain(m *testing.M) { os.Exit(exampletest.Main(m, schema)) }

// The service keeps its tables and idem's in its schema: started twice on a
// database of the test's own, with a DATABASE_URL that names no
// search_path, it leaves public and every other schema as they were.
func TestKeepsToItsSchema(t *testing.T) {
	exampletest.KeepsToSchema(t, schema, func(url string) { newTestServerOn(t, url) })
}

func newTestServer(t *testing.T) (*httptest.Server, *service) {
	t.Helper()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	return newTestServerOn(t, url)
}

// newTestServerOn serves the example on the database at url until the test
// ends.
func newTestServerOn(t *testing.T, url string) (*httptest.Server, *service) {
	t.Helper()
	t.Setenv("DATABASE_URL", url)
	ctx := context.Background()
	pool, err := connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	svc, err := setup(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(svc.routes())
	t.Cleanup(srv.Close)
	return srv, svc
}

type reply struct {
	status int
	header http.Header
	body   map[string]any
}

func call(t *testing.T, method, url, body string, headers ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1]) // a header named twice is sent twice
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	r := reply{status: resp.StatusCode, header: resp.Header}
	if err := json.Unmarshal(data, &r.body); err != nil {
		t.Fatalf("%s %s: not JSON: %s", method, url, data)
	}
	return r
}

func TestOrderWalkthrough(t *testing.T) {
	srv, _ := newTestServer(t)
	key := fmt.Sprintf("walk-%s", t.Name())
	user := fmt.Sprintf("u-%d", os.Getpid())

	wantProblem(t, call(t, "POST", srv.URL+"/orders", `{"amount_cents": 1999}`), 400, "idempotency-key-missing")
	first := call(t, "POST", srv.URL+"/orders", `{"amount_cents": 1999}`, "Idempotency-Key", key, "X-User", user)
	if first.status != 201 || first.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("create: %+v", first)
	}
	again := call(t, "POST", srv.URL+"/orders", `{"amount_cents": 1999}`, "Idempotency-Key", key, "X-User", user)
	if again.status != 201 || again.header.Get("Idempotent-Replayed") != "true" || again.body["id"] != first.body["id"] {
		t.Fatalf("retry must replay the first order: %+v vs %+v", again, first)
	}
	if r := call(t, "POST", srv.URL+"/orders", `{"amount_cents": 5}`, "Idempotency-Key", key, "X-User", user); r.status != 422 {
		t.Fatalf("key reused with another body: %d", r.status)
	}
	other := call(t, "POST", srv.URL+"/orders", `{"amount_cents": 1999}`, "Idempotency-Key", key, "X-User", user+"-other")
	if other.status != 201 || other.body["id"] == first.body["id"] {
		t.Fatalf("another user's same key is another order: %+v", other)
	}

	id := int64(first.body["id"].(float64))
	event := fmt.Sprintf(`{"message_id": "evt-%s-%d", "order_id": %d, "payment_ref": "ch_1"}`, user, id, id)
	if r := call(t, "POST", srv.URL+"/events/payment", event); r.body["processed"] != true || r.body["order_paid_now"] != true {
		t.Fatalf("first delivery: %+v", r.body)
	}
	if r := call(t, "POST", srv.URL+"/events/payment", event); r.body["processed"] != false {
		t.Fatalf("redelivery must be acknowledged without processing: %+v", r.body)
	}
	base := fmt.Sprintf("%s/orders/%d/", srv.URL, id)
	if r := call(t, "POST", base+"pay", ""); r.status != 200 || r.body["applied"] != false {
		t.Fatalf("paying a paid order is a no-op: %+v", r)
	}
	if r := call(t, "POST", base+"cancel", ""); r.status != 409 || r.body["state"] != "PAID" {
		t.Fatalf("cancelling a paid order: %+v", r)
	}
	for _, action := range []string{"ship", "refund"} {
		if r := call(t, "POST", base+action, ""); r.status != 200 || r.body["applied"] != true {
			t.Fatalf("%s: %+v", action, r)
		}
	}
	got := call(t, "GET", fmt.Sprintf("%s/orders/%d", srv.URL, id), "")
	history := got.body["history"].([]any)
	var path []string
	for _, h := range history {
		step := h.(map[string]any)
		path = append(path, fmt.Sprintf("%s->%s", step["from"], step["to"]))
	}
	if strings.Join(path, " ") != "PENDING->PAID PAID->SHIPPED SHIPPED->REFUNDED" {
		t.Fatalf("history: %v", path)
	}
	if r := call(t, "POST", srv.URL+"/orders/999999999/pay", ""); r.status != 404 {
		t.Fatalf("missing order: %d", r.status)
	}
}

// A double click: many concurrent creates with one key make one order.
func TestOrderConcurrentCreates(t *testing.T) {
	srv, svc := newTestServer(t)
	user := fmt.Sprintf("burst-%d", os.Getpid())
	var wg sync.WaitGroup
	var mu sync.Mutex
	ids := map[any]int{}
	for range 20 {
		wg.Go(func() {
			r := call(t, "POST", srv.URL+"/orders", `{"amount_cents": 500}`, "Idempotency-Key", "dbl", "X-User", user)
			mu.Lock()
			defer mu.Unlock()
			switch r.status {
			case 201:
				ids[r.body["id"]]++
			case 409:
			default:
				t.Errorf("status %d: %v", r.status, r.body)
			}
		})
	}
	wg.Wait()
	if len(ids) != 1 {
		t.Fatalf("want one order id in the answers, got %v", ids)
	}
	var rows int
	if err := svc.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE user_id = $1`, user).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 1 {
		t.Fatalf("%d orders for one key", rows)
	}
}

// A body over the limit is refused whole: fingerprinting only its first MiB
// would replay a different request as the first one.
func TestCreateOrderBodyTooLarge(t *testing.T) {
	srv, svc := newTestServer(t)
	user := fmt.Sprintf("big-%d", os.Getpid())
	valid := `{"amount_cents": 1999}`
	atLimit := valid + strings.Repeat(" ", maxBody-len(valid))
	if r := call(t, "POST", srv.URL+"/orders", atLimit, "Idempotency-Key", "big", "X-User", user); r.status != 201 {
		t.Fatalf("a body of exactly %d bytes: %+v", maxBody, r)
	}
	for _, size := range []int{maxBody + 1, 10 << 20} {
		body := atLimit + strings.Repeat("x", size-maxBody)
		r := call(t, "POST", srv.URL+"/orders", body, "Idempotency-Key", "big", "X-User", user)
		wantProblem(t, r, 413, "body-too-large")
		if r.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("a %d-byte body was replayed as the first request: %+v", size, r)
		}
	}
	if n := countOrders(t, svc, user); n != 1 {
		t.Fatalf("%d orders, want 1", n)
	}
	event := `{"message_id": "big", "order_id": 1, "payment_ref": "ch_1"}`
	wantProblem(t, call(t, "POST", srv.URL+"/events/payment", event+strings.Repeat(" ", maxBody)), 413, "body-too-large")
}

// Two Idempotency-Key headers, or two keys in one, are refused as idemhttp's
// middleware refuses them, not answered with the first key's order.
func TestCreateOrderRepeatedKey(t *testing.T) {
	srv, svc := newTestServer(t)
	user := fmt.Sprintf("twice-%d", os.Getpid())
	for _, c := range []struct {
		keys []string
		says string // in the problem's detail
	}{
		{[]string{"k1", "k2"}, "The request has 2 Idempotency-Key headers: send exactly one."},
		{[]string{"k1, k2"}, "The Idempotency-Key header holds a list"},
		{[]string{"k1", "k1"}, "The request has 2 Idempotency-Key headers"},
	} {
		var headers []string
		for _, k := range c.keys {
			headers = append(headers, "Idempotency-Key", k)
		}
		r := call(t, "POST", srv.URL+"/orders", `{"amount_cents": 1999}`, append(headers, "X-User", user)...)
		wantProblem(t, r, 400, "idempotency-key-invalid")
		if detail, _ := r.body["detail"].(string); !strings.Contains(detail, c.says) {
			t.Fatalf("keys %q: detail %q does not say %q", c.keys, detail, c.says)
		}
	}
	if n := countOrders(t, svc, user); n != 0 {
		t.Fatalf("%d orders, want none", n)
	}
}

// wantProblem fails t unless r is an RFC 9457 problem details object with
// status and code, as idemhttp's middleware writes them.
func wantProblem(t *testing.T, r reply, status int, code string) {
	t.Helper()
	if r.status != status || r.header.Get("Content-Type") != "application/problem+json" ||
		r.body["status"] != float64(status) || r.body["code"] != code || r.body["title"] != http.StatusText(status) {
		t.Fatalf("want a %d problem %q, got %d %s %v", status, code, r.status, r.header.Get("Content-Type"), r.body)
	}
}

func countOrders(t *testing.T, svc *service, user string) int {
	t.Helper()
	var n int
	if err := svc.pool.QueryRow(context.Background(), `SELECT count(*) FROM orders WHERE user_id = $1`, user).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// A second instance, whose port is taken, fails to bind and says so without
// first announcing that it listens.
func TestRunPortTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	// With a database at hand, only the port can make run fail.
	t.Setenv("DATABASE_URL", os.Getenv("TEST_DATABASE_URL"))
	var out strings.Builder
	err = run(context.Background(), taken.Addr().String(), &out)
	var bindErr *net.OpError
	if !errors.As(err, &bindErr) || bindErr.Op != "listen" {
		t.Fatalf("run on a taken port returned %v, want the bind error", err)
	}
	if strings.Contains(out.String(), "listening") {
		t.Fatalf("run announced a port it could not bind:\n%s", out.String())
	}
}

// run announces the address it has bound, port 0 resolved, and where its
// tables are, serves on it at once, and returns when its context ends.
func TestRunAnnouncesBoundAddress(t *testing.T) {
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	t.Setenv("DATABASE_URL", url)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, stdout := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, "127.0.0.1:0", stdout)
		stdout.Close()
	}()
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatalf("run printed nothing and returned %v", <-done)
	}
	first := lines.Text()
	if !lines.Scan() {
		t.Fatalf("run printed one line and returned %v", <-done)
	}
	exampletest.SaysWhere(t, lines.Text(), schema)
	go io.Copy(io.Discard, out) //nolint:errcheck // the rest of the output
	var base string
	if _, err := fmt.Sscanf(first, "orders example listening on %s", &base); err != nil || strings.HasSuffix(base, ":0") {
		t.Fatalf("first line %q does not name the bound address", first)
	}
	if r := call(t, "GET", base+"/orders/999999999", ""); r.status != 404 {
		t.Fatalf("GET on the announced address: %+v", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after its context ended: %v", err)
	}
}
