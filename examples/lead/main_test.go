package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemkit/idem/examples/internal/browser"
	"github.com/idemkit/idem/examples/internal/exampletest"
)

// The tests leave no schema behind (see exampletest.Main).
func TestMain(m *testing.M) { os.Exit(exampletest.Main(m, schema)) }

func newTestServer(t *testing.T) (*httptest.Server, *pgxpool.Pool) {
	t.Helper()
	url := os.Getenv("TEST_DATABASE_URL")
	if url == "" {
		t.Fatal("TEST_DATABASE_URL is not set: point it at a PostgreSQL database (see README.md)")
	}
	ctx := context.Background()
	pool, err := connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	h, err := newHandler(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, pool
}

func leads(t *testing.T, pool *pgxpool.Pool, email string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM leads WHERE email = $1`, email).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func fill(email string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		return chromedp.Void{}, chromedp.Do(ctx,
			chromedp.SendKeys(`input[name="name"]`, "Ada"),
			chromedp.SendKeys(`input[name="email"]`, email),
			chromedp.SendKeys(`textarea[name="message"]`, "Call me"),
		)
	}
}

func pendingStored(t *testing.T, ctx context.Context) bool {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`localStorage.getItem("lead-pending") !== null`))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// countSends makes the page count the requests it starts (the submission and
// every resend) in window.leadSends, so that a test can wait for a resend
// rather than sleep past the page's interval.
const countSends = `(() => {
  window.leadSends = 0;
  const send = window.fetch.bind(window);
  window.fetch = (...args) => { window.leadSends++; return send(...args); };
  return 0;
})()`

// waitSends waits until the page has started n requests since countSends.
func waitSends(t *testing.T, ctx context.Context, timeout time.Duration, n int) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		sent, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.leadSends`))
		if err != nil {
			t.Fatal(err)
		}
		if sent >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page started %d requests within %v, want %d", sent, timeout, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// blockAPI makes the lead API unreachable (or reachable again) and tells the
// page it is offline (or online).
func blockAPI(t *testing.T, ctx context.Context, base string, blocked bool) {
	t.Helper()
	var patterns []*network.BlockPattern
	if blocked {
		patterns = []*network.BlockPattern{{URLPattern: base + "/api/*", Block: true}}
	}
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.SetBlockedURLs, network.SetBlockedURLsParams{URLPatterns: patterns}); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Call(ctx, network.OverrideNetworkState, network.OverrideNetworkStateParams{
		Offline: blocked, DownloadThroughput: -1, UploadThroughput: -1}); err != nil {
		t.Fatal(err)
	}
}

// Offline, submit (the submission is kept), back online: it is delivered
// once and the pending copy is cleared.
func TestLeadOfflineThenOnline(t *testing.T) {
	srv, pool := newTestServer(t)
	ctx := browser.New(t)
	email := fmt.Sprintf("offline-%d@example.com", time.Now().UnixNano())
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL), fill(email)); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](countSends)); err != nil {
		t.Fatal(err)
	}
	blockAPI(t, ctx, srv.URL, true)
	if err := chromedp.Do(ctx, chromedp.Click("#submit")); err != nil {
		t.Fatal(err)
	}
	browser.WaitState(t, ctx, 10*time.Second, "pending")
	if !pendingStored(t, ctx) {
		t.Fatal("the failed submission was not kept in localStorage")
	}
	waitSends(t, ctx, 10*time.Second, 2) // an interval resend while still offline
	if n := leads(t, pool, email); n != 0 {
		t.Fatalf("%d leads while offline", n)
	}
	blockAPI(t, ctx, srv.URL, false)
	_, text := browser.WaitState(t, ctx, 10*time.Second, "done")
	if !strings.Contains(text, "Thank you, Ada") {
		t.Fatalf("page says %q", text)
	}
	if pendingStored(t, ctx) {
		t.Error("the delivered submission is still pending")
	}
	if n := leads(t, pool, email); n != 1 {
		t.Fatalf("%d leads", n)
	}
}

// A pending submission survives a reload and is delivered, once, by the
// reloaded page with its original key.
func TestLeadPendingSurvivesReload(t *testing.T) {
	srv, pool := newTestServer(t)
	ctx := browser.New(t)
	email := fmt.Sprintf("reload-%d@example.com", time.Now().UnixNano())
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL), fill(email)); err != nil {
		t.Fatal(err)
	}
	blockAPI(t, ctx, srv.URL, true)
	if err := chromedp.Do(ctx, chromedp.Click("#submit")); err != nil {
		t.Fatal(err)
	}
	browser.WaitState(t, ctx, 10*time.Second, "pending")
	key, err := chromedp.Run(ctx, chromedp.Evaluate[string](`JSON.parse(localStorage.getItem("lead-pending")).key`))
	if err != nil || key == "" {
		t.Fatalf("no pending key: %v", err)
	}
	if err := chromedp.Do(ctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	if !pendingStored(t, ctx) {
		t.Fatal("the pending submission did not survive the reload")
	}
	blockAPI(t, ctx, srv.URL, false)
	browser.WaitState(t, ctx, 10*time.Second, "done")
	if n := leads(t, pool, email); n != 1 {
		t.Fatalf("%d leads", n)
	}
	var recorded int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotent_record WHERE key = $1 AND status = 'succeeded'`, key).Scan(&recorded); err != nil {
		t.Fatal(err)
	}
	if recorded != 1 {
		t.Fatalf("the lead was not recorded under the key made when the form opened (%s)", key)
	}
}

// A double click on the lead form sends one request; a resend of the same
// key is answered with the first result and stores nothing more.
func TestLeadDoubleClick(t *testing.T) {
	srv, pool := newTestServer(t)
	ctx := browser.New(t)
	email := fmt.Sprintf("double-%d@example.com", time.Now().UnixNano())
	if err := chromedp.Do(ctx, chromedp.Navigate(srv.URL), fill(email), chromedp.DoubleClick("#submit")); err != nil {
		t.Fatal(err)
	}
	browser.WaitState(t, ctx, 10*time.Second, "done")
	if n := leads(t, pool, email); n != 1 {
		t.Fatalf("%d leads", n)
	}
}
