package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkit/idem/examples/internal/browser"
	"github.com/idemkit/idem/examples/internal/exampletest"
)

// The tests leave no schema behind (see exampletest.Main).
func TestMain(m *testing.M) { os.Exit(exampletest.Main(m, schema)) }

type testServer struct {
	*httptest.Server
	app   *app
	posts atomic.Int64
}

func newTestServer(t *testing.T) *testServer {
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
	a, err := newApp(ctx, pool) // a new activity per test
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{app: a}
	routes := a.routes()
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			ts.posts.Add(1)
		}
		routes.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func (ts *testServer) signups(t *testing.T, user int) int {
	t.Helper()
	var n int
	if err := ts.app.pool.QueryRow(context.Background(),
		`SELECT count(*) FROM signups WHERE user_id = $1 AND activity_id = $2`, user, ts.app.activityID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestSignupPageDoubleClick(t *testing.T) {
	ts := newTestServer(t)
	ctx := browser.New(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/?user=1")); err != nil {
		t.Fatal(err)
	}
	browser.WaitState(t, ctx, 10*time.Second, "ready")
	if err := chromedp.Do(ctx, chromedp.DoubleClick("#submit")); err != nil {
		t.Fatal(err)
	}
	_, text := browser.WaitState(t, ctx, 10*time.Second, "done")
	if !strings.Contains(text, "Signed up") {
		t.Fatalf("page says %q", text)
	}
	disabled, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("submit").disabled`))
	if !disabled {
		t.Error("the button is enabled again after the token was spent")
	}
	if n := ts.signups(t, 1); n != 1 {
		t.Fatalf("%d sign-ups", n)
	}
	if p := ts.posts.Load(); p != 1 {
		t.Fatalf("a double click sent %d POSTs", p)
	}
}

// The server commits the sign-up, waits, and drops the connection without
// answering; the page retries with the same token and shows the replayed
// answer, with one sign-up.
func TestSignupPageLostResponse(t *testing.T) {
	ts := newTestServer(t)
	ts.app.dropFirst.Store(1)
	ts.app.dropDelay = 300 * time.Millisecond
	ctx := browser.New(t)
	if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/?user=2"), chromedp.WaitVisible("#submit")); err != nil {
		t.Fatal(err)
	}
	browser.WaitState(t, ctx, 10*time.Second, "ready")
	if err := chromedp.Do(ctx, chromedp.Click("#submit")); err != nil {
		t.Fatal(err)
	}
	_, text := browser.WaitState(t, ctx, 15*time.Second, "done")
	if !strings.Contains(text, "(confirmed)") {
		t.Fatalf("want the replayed answer, page says %q", text)
	}
	if n := ts.signups(t, 2); n != 1 {
		t.Fatalf("%d sign-ups", n)
	}
	if p := ts.posts.Load(); p < 2 {
		t.Fatalf("the page sent %d POSTs; it should have retried", p)
	}
}

// A second device (another page, another token) gets "already signed up".
func TestSignupPageSecondDevice(t *testing.T) {
	ts := newTestServer(t)
	ctx := browser.New(t)
	for i, want := range []string{"done", "already"} {
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/?user=3")); err != nil {
			t.Fatal(err)
		}
		browser.WaitState(t, ctx, 10*time.Second, "ready")
		if err := chromedp.Do(ctx, chromedp.Click("#submit")); err != nil {
			t.Fatal(err)
		}
		state, text := browser.WaitState(t, ctx, 10*time.Second, "done", "already", "error")
		if state != want {
			t.Fatalf("device %d: %s %q, want %s", i+1, state, text, want)
		}
	}
	if n := ts.signups(t, 3); n != 1 {
		t.Fatalf("%d sign-ups", n)
	}
}
