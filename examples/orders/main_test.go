package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
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

func newTestServer(t *testing.T) (*httptest.Server, *service) {
	t.Helper()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
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
		req.Header.Set(headers[i], headers[i+1])
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

	if r := call(t, "POST", srv.URL+"/orders", `{"amount_cents": 1999}`); r.status != 400 {
		t.Fatalf("no key: %d", r.status)
	}
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
	if r := call(t, "POST", base+"cancel", ""); r.status != 409 || r.body["status"] != "PAID" {
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
