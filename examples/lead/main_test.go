package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/idemkit/idem/examples/internal/browser"
	"github.com/idemkit/idem/examples/internal/exampledb"
	"github.com/idemkit/idem/examples/internal/exampletest"
)

// The tests leave no schema behind (see exampletest.Main).
func TestMain(m *testing.M) { os.Exit(exampletest.Main(m, schema)) }

// The service keeps its tables and idem's in its schema: started twice on a
// database of the test's own, with a DATABASE_URL that names no
// search_path, it leaves public and every other schema as they were.
func TestKeepsToItsSchema(t *testing.T) {
	exampletest.KeepsToSchema(t, schema, func(url string) { newTestServerOn(t, url, schema) })
}

// On MySQL, its tables and idem's go to its database, none to the one
// the URL names.
func TestKeepsToItsDatabase(t *testing.T) {
	exampletest.KeepsToDatabase(t, func(url, database string) { newTestServerOn(t, url, database) })
}

type testServer struct {
	*httptest.Server
	db    *exampledb.DB
	posts atomic.Int64 // the POSTs that reached the server
}

func newTestServer(t *testing.T, b exampletest.Backend) *testServer {
	t.Helper()
	return newTestServerOn(t, b.URL, b.Tables)
}

// newTestServerOn serves the example on the database at url, with its
// tables under name, until the test ends.
func newTestServerOn(t *testing.T, url, name string) *testServer {
	t.Helper()
	ctx := context.Background()
	db, err := connect(ctx, url, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(db.Close)
	h, err := newHandler(ctx, storeOf(db, name))
	if err != nil {
		t.Fatal(err)
	}
	ts := &testServer{db: db}
	ts.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			ts.posts.Add(1)
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts
}

func (ts *testServer) leads(t *testing.T, email string) int {
	t.Helper()
	return exampletest.Count(t, ts.db, `SELECT count(*) FROM leads WHERE email = ?`, email)
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

// countSends makes the page count the POSTs it starts (the submission and
// every resend) in window.leadSends, so that a test can wait for a resend
// rather than sleep past the page's interval.
const countSends = `(() => {
  window.leadSends = 0;
  const send = window.fetch.bind(window);
  window.fetch = (url, init) => {
    if (init?.method === "POST") window.leadSends++;
    return send(url, init);
  };
  return 0;
})()`

// waitSends waits until the page has started n POSTs since countSends.
func waitSends(t *testing.T, ctx context.Context, timeout time.Duration, n int) {
	t.Helper()
	browser.Wait(t, ctx, timeout, fmt.Sprintf("window.leadSends >= %d", n))
}

// blockAPI makes the lead API unreachable (or reachable again) and tells the
// page it is offline (or online), as a real loss of network does.
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
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		email := fmt.Sprintf("offline-%d@example.com", time.Now().UnixNano())
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL), fill(email)); err != nil {
			t.Fatal(err)
		}
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](countSends)); err != nil {
			t.Fatal(err)
		}
		blockAPI(t, ctx, ts.URL, true)
		browser.Click(t, ctx, "#submit")
		browser.WaitState(t, ctx, 10*time.Second, "pending")
		if !pendingStored(t, ctx) {
			t.Fatal("the failed submission was not kept in localStorage")
		}
		waitSends(t, ctx, 10*time.Second, 2) // a resend while still offline
		if n := ts.leads(t, email); n != 0 {
			t.Fatalf("%d leads while offline", n)
		}
		blockAPI(t, ctx, ts.URL, false)
		_, text := browser.WaitState(t, ctx, 10*time.Second, "done")
		if !strings.Contains(text, "Thank you, Ada") {
			t.Fatalf("page says %q", text)
		}
		if pendingStored(t, ctx) {
			t.Error("the delivered submission is still pending")
		}
		if n := ts.leads(t, email); n != 1 {
			t.Fatalf("%d leads", n)
		}
	})
}

// The panel's offline switch: a message sent while offline is kept, nothing
// is sent, and going back online sends it once.
func TestLeadPanelOfflineThenOnline(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		email := fmt.Sprintf("switch-%d@example.com", time.Now().UnixNano())
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL), fill(email)); err != nil {
			t.Fatal(err)
		}
		browser.GoOffline(t, ctx)
		browser.Click(t, ctx, "#submit")
		browser.WaitState(t, ctx, 10*time.Second, "pending")
		time.Sleep(2500 * time.Millisecond) // past the page's resend interval: it must not send while offline
		if p := ts.posts.Load(); p != 0 {
			t.Fatalf("%d POSTs while offline", p)
		}
		if !pendingStored(t, ctx) {
			t.Fatal("the message was not kept in localStorage")
		}
		browser.Click(t, ctx, "#go-offline") // back online now
		browser.WaitState(t, ctx, 10*time.Second, "done")
		browser.WaitRows(t, ctx, 1)
		if p := ts.posts.Load(); p != 1 {
			t.Fatalf("back online, the page sent %d POSTs, want 1", p)
		}
		if n := ts.leads(t, email); n != 1 {
			t.Fatalf("%d leads", n)
		}
		var statuses []string
		for _, r := range browser.Requests(t, ctx) {
			if r.Method == http.MethodPost {
				statuses = append(statuses, r.Status)
			}
		}
		if strings.Join(statuses, ",") != "offline,201" {
			t.Errorf("the panel's POSTs are %v, want the one kept offline and the one sent", statuses)
		}
	})
}

// The panel's "drop the next response" switch: the server stores the lead
// and drops the connection without answering; the page resends with the
// same key and gets the recorded answer, Idempotent-Replayed: true, which
// the panel shows, and the row count stays at one. With IDEM_SCREENSHOTS
// set, the test saves the page to docs/images/lead.png.
func TestLeadLostResponse(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL),
			chromedp.SendKeys(`input[name="name"]`, "Ada Lovelace"),
			chromedp.SendKeys(`input[name="email"]`, "ada@example.com"),
			chromedp.SendKeys(`textarea[name="message"]`, "We need a booking page for our climbing gym. Can you call me this week?"),
		); err != nil {
			t.Fatal(err)
		}
		browser.Click(t, ctx, "#drop-next")
		browser.Click(t, ctx, "#submit")
		_, text := browser.WaitState(t, ctx, 15*time.Second, "done")
		if !strings.Contains(text, "record") {
			t.Fatalf("want the replayed answer explained, page says %q", text)
		}
		if p := ts.posts.Load(); p < 2 {
			t.Fatalf("the server saw %d POSTs; the page should have resent", p)
		}
		browser.WaitRows(t, ctx, 1)
		key := browser.DroppedThenReplayed(t, ctx)
		if n := exampletest.Count(t, ts.db, `SELECT count(*) FROM leads WHERE idempotency_key = ?`, key); n != 1 {
			t.Fatalf("%d leads under the key", n)
		}
		browser.Fits(t, ctx)
		browser.SaveScreenshot(t, ctx, "../../docs/images/lead.png")
	})
}

// The form is checked in the page: nothing is sent until the name is given
// and the e-mail address looks like one, and each field says what is wrong.
func TestLeadValidatesBeforeSending(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL)); err != nil {
			t.Fatal(err)
		}
		errorOf := func(field string) string {
			t.Helper()
			text, err := chromedp.Run(ctx, chromedp.Evaluate[string](
				`(() => { const e = document.getElementById("`+field+`-error"); return e.hidden ? "" : e.textContent; })()`))
			if err != nil {
				t.Fatal(err)
			}
			return text
		}
		email := fmt.Sprintf("checked-%d@example", time.Now().UnixNano()) // .com comes later
		browser.Click(t, ctx, "#submit")
		browser.WaitState(t, ctx, 5*time.Second, "invalid")
		if errorOf("name") == "" || errorOf("email") == "" {
			t.Fatalf("an empty form shows name %q and e-mail %q", errorOf("name"), errorOf("email"))
		}
		if err := chromedp.Do(ctx,
			chromedp.SendKeys(`input[name="name"]`, "Ada"),
			chromedp.SendKeys(`input[name="email"]`, email),
		); err != nil {
			t.Fatal(err)
		}
		browser.Click(t, ctx, "#submit")
		browser.WaitState(t, ctx, 5*time.Second, "invalid")
		if msg := errorOf("email"); !strings.Contains(msg, "e-mail address") {
			t.Errorf("a wrong e-mail address shows %q", msg)
		}
		if msg := errorOf("name"); msg != "" {
			t.Errorf("a given name still shows %q", msg)
		}
		if p := ts.posts.Load(); p != 0 || pendingStored(t, ctx) {
			t.Fatalf("an invalid form was sent (%d POSTs) or kept", p)
		}
		if err := chromedp.Do(ctx, chromedp.SendKeys(`input[name="email"]`, ".com")); err != nil {
			t.Fatal(err)
		}
		if msg := errorOf("email"); msg != "" {
			t.Errorf("a corrected e-mail address still shows %q", msg)
		}
		browser.Click(t, ctx, "#submit")
		browser.WaitState(t, ctx, 10*time.Second, "done")
		if n := ts.leads(t, email+".com"); n != 1 {
			t.Fatalf("%d leads for the corrected form", n)
		}
	})
}

// A pending submission survives a reload and is delivered, once, by the
// reloaded page with its original key.
func TestLeadPendingSurvivesReload(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		email := fmt.Sprintf("reload-%d@example.com", time.Now().UnixNano())
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL), fill(email)); err != nil {
			t.Fatal(err)
		}
		blockAPI(t, ctx, ts.URL, true)
		browser.Click(t, ctx, "#submit")
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
		blockAPI(t, ctx, ts.URL, false)
		browser.WaitState(t, ctx, 10*time.Second, "done")
		if n := ts.leads(t, email); n != 1 {
			t.Fatalf("%d leads", n)
		}
		column := "key" // idem's record table names the key's column idem_key on MySQL
		if b.MySQL() {
			column = "idem_key"
		}
		if recorded := exampletest.Count(t, ts.db, `SELECT count(*) FROM idempotent_record WHERE `+column+` = ? AND status = 'succeeded'`, key); recorded != 1 {
			t.Fatalf("the lead was not recorded under the key made when the form opened (%s)", key)
		}
	})
}

// A double click on the lead form sends one request; a resend of the same
// key is answered with the first result and stores nothing more.
func TestLeadDoubleClick(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		email := fmt.Sprintf("double-%d@example.com", time.Now().UnixNano())
		if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL), fill(email)); err != nil {
			t.Fatal(err)
		}
		browser.DoubleClick(t, ctx)
		browser.WaitState(t, ctx, 10*time.Second, "done")
		if n := ts.leads(t, email); n != 1 {
			t.Fatalf("%d leads", n)
		}
		if p := ts.posts.Load(); p != 1 {
			t.Fatalf("a double click sent %d POSTs", p)
		}
	})
}

// A start on a port that is taken fails at once, before it reaches the
// database; a start that binds says where it listens and where its tables
// are, serves there, and stops when its context is done.
func TestRun(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		var out strings.Builder
		// A database that cannot be reached: the error must be the port's.
		unreachable := "postgres://nobody@127.0.0.1:1/none?connect_timeout=1"
		if b.MySQL() {
			unreachable = "mysql://nobody@127.0.0.1:1/none?timeout=1s"
		}
		err = run(context.Background(), taken.Addr().String(), unreachable, b.Tables, &out)
		if err == nil || !strings.Contains(err.Error(), "address already in use") || out.Len() > 0 {
			t.Fatalf("run on a taken port: %v, announced %q", err, out.String())
		}

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() { done <- run(ctx, "127.0.0.1:0", b.URL, b.Tables, pw); pw.Close() }()
		lines := bufio.NewReader(pr)
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		where, err := lines.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		exampletest.SaysWhereOn(t, b, where)
		go io.Copy(io.Discard, pr)
		_, url, ok := strings.Cut(strings.TrimSpace(line), "listening on ")
		if !ok {
			t.Fatalf("run announced %q", line)
		}
		res, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d", url, res.StatusCode)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("run after its context was done: %v", err)
		}
	})
}
