package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idemkit/idem/examples/internal/browser"
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
	app   *app
	posts atomic.Int64
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
	a, err := newApp(ctx, db, name) // a new activity per test
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
	return exampletest.Count(t, ts.app.db, `SELECT count(*) FROM signups WHERE user_id = ? AND activity_id = ?`, user, ts.app.activityID)
}

// open opens the page as user and waits until it is ready to sign up.
func (ts *testServer) open(t *testing.T, ctx context.Context, user int) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Navigate(fmt.Sprintf("%s/?user=%d", ts.URL, user))); err != nil {
		t.Fatal(err)
	}
	browser.WaitState(t, ctx, 10*time.Second, "ready")
}

func buttonDisabled(t *testing.T, ctx context.Context) bool {
	t.Helper()
	disabled, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById("submit").disabled`))
	if err != nil {
		t.Fatal(err)
	}
	return disabled
}

func TestSignupPageDoubleClick(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		ts.open(t, ctx, 1)
		browser.DoubleClick(t, ctx)
		_, text := browser.WaitState(t, ctx, 10*time.Second, "done")
		if !strings.Contains(text, "Signed up") {
			t.Fatalf("page says %q", text)
		}
		if !buttonDisabled(t, ctx) {
			t.Error("the button is enabled again after the token was spent")
		}
		if n := ts.signups(t, 1); n != 1 {
			t.Fatalf("%d sign-ups", n)
		}
		if p := ts.posts.Load(); p != 1 {
			t.Fatalf("a double click sent %d POSTs", p)
		}
	})
}

// The panel's "drop the next response" switch: the server commits the
// sign-up and drops the connection without answering; the page resends
// with the same token and gets the recorded answer, Idempotent-Replayed:
// true, which the panel shows, and the row count stays at one. With
// IDEM_SCREENSHOTS set, the test saves the page to docs/images/signup.png.
func TestSignupPageLostResponse(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		ts.open(t, ctx, 2)
		browser.Click(t, ctx, "#drop-next")
		browser.Click(t, ctx, "#submit")
		_, text := browser.WaitState(t, ctx, 15*time.Second, "done")
		if !strings.Contains(text, "record") {
			t.Fatalf("want the replayed answer explained, page says %q", text)
		}
		if n := ts.signups(t, 2); n != 1 {
			t.Fatalf("%d sign-ups", n)
		}
		if p := ts.posts.Load(); p < 2 {
			t.Fatalf("the server saw %d POSTs; the page should have resent", p)
		}
		browser.WaitRows(t, ctx, 1)

		browser.DroppedThenReplayed(t, ctx)
		browser.Fits(t, ctx)
		browser.SaveScreenshot(t, ctx, "../../docs/images/signup.png")
	})
}

// The panel's offline switch: a sign-up while offline is kept, nothing is
// sent, and going back online sends it once.
func TestSignupPageOfflineThenOnline(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		ts.open(t, ctx, 4)
		browser.GoOffline(t, ctx)
		browser.Click(t, ctx, "#submit")
		browser.WaitState(t, ctx, 10*time.Second, "pending")
		time.Sleep(2500 * time.Millisecond) // past the page's resend interval: it must not send while offline
		if p := ts.posts.Load(); p != 0 {
			t.Fatalf("%d POSTs while offline", p)
		}
		browser.Click(t, ctx, "#go-offline") // back online now
		browser.WaitState(t, ctx, 10*time.Second, "done")
		browser.WaitRows(t, ctx, 1)
		if p := ts.posts.Load(); p != 1 {
			t.Fatalf("back online, the page sent %d POSTs, want 1", p)
		}
		if n := ts.signups(t, 4); n != 1 {
			t.Fatalf("%d sign-ups", n)
		}
		rows := browser.Requests(t, ctx)
		var statuses []string
		for _, r := range rows {
			if r.Method == http.MethodPost {
				statuses = append(statuses, r.Status)
			}
		}
		if strings.Join(statuses, ",") != "offline,201" {
			t.Errorf("the panel's POSTs are %v, want the one kept offline and the one sent", statuses)
		}
	})
}

// A second device (another page, another token) that opened before the
// first signed up gets "already signed up".
func TestSignupPageSecondDevice(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		phone := browser.New(t)
		laptop, cancel := chromedp.NewContext(phone) // another tab: another page, another token
		t.Cleanup(cancel)
		ts.open(t, phone, 3)
		ts.open(t, laptop, 3)
		for i, dev := range []struct {
			ctx  context.Context
			want string
		}{{phone, "done"}, {laptop, "already"}} {
			browser.Click(t, dev.ctx, "#submit")
			state, text := browser.WaitState(t, dev.ctx, 10*time.Second, "done", "already", "error")
			if state != dev.want {
				t.Fatalf("device %d: %s %q, want %s", i+1, state, text, dev.want)
			}
		}
		if n := ts.signups(t, 3); n != 1 {
			t.Fatalf("%d sign-ups", n)
		}
	})
}

// After a sign-up, a reload asks the server and says so, with the button
// disabled.
func TestSignupPageReloadAfterSignup(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		ts.open(t, ctx, 5)
		browser.Click(t, ctx, "#submit")
		browser.WaitState(t, ctx, 10*time.Second, "done")
		if err := chromedp.Do(ctx, chromedp.Reload()); err != nil {
			t.Fatal(err)
		}
		_, text := browser.WaitState(t, ctx, 10*time.Second, "signed-up")
		if !strings.Contains(text, "You are signed up") {
			t.Fatalf("after a reload the page says %q", text)
		}
		if !buttonDisabled(t, ctx) {
			t.Error("the button is enabled for a user who is signed up")
		}
		browser.WaitRows(t, ctx, 1)
		if p := ts.posts.Load(); p != 1 {
			t.Fatalf("%d POSTs", p)
		}
	})
}

// An unknown user is told so, and cannot sign up.
func TestSignupPageUnknownUser(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := browser.New(t)
		for _, user := range []string{"9", "abc"} {
			if err := chromedp.Do(ctx, chromedp.Navigate(ts.URL+"/?user="+user)); err != nil {
				t.Fatal(err)
			}
			_, text := browser.WaitState(t, ctx, 10*time.Second, "unauthorized")
			if !strings.Contains(text, "“"+user+"”") || !strings.Contains(text, "users 1 to 5") {
				t.Errorf("user %s: the page says %q", user, text)
			}
			if !buttonDisabled(t, ctx) {
				t.Errorf("user %s: the button is enabled", user)
			}
		}
		if p := ts.posts.Load(); p != 0 {
			t.Fatalf("%d POSTs", p)
		}
	})
}

// signUp asks for a token as user and signs up with it to activity, as the
// page does, and returns the answer's status, content type and body.
func (ts *testServer) signUp(t *testing.T, user int, activity int64) (int, string, []byte) {
	t.Helper()
	status, ctype, body, err := ts.post(user, ts.token(t, user), activity)
	if err != nil {
		t.Fatal(err)
	}
	return status, ctype, body
}

// token fetches a submission token for user, as the page does when it opens.
func (ts *testServer) token(t *testing.T, user int) string {
	t.Helper()
	get, _ := http.NewRequest(http.MethodGet, ts.URL+"/api/idem-token", nil)
	get.Header.Set("X-User", strconv.Itoa(user))
	res, err := http.DefaultClient.Do(get)
	if err != nil {
		t.Fatal(err)
	}
	var tok struct{ Token string }
	err = json.NewDecoder(res.Body).Decode(&tok)
	res.Body.Close()
	if err != nil || tok.Token == "" {
		t.Fatalf("no token: %d %v", res.StatusCode, err)
	}
	return tok.Token
}

// post sends a sign-up with token; it may run on any goroutine.
func (ts *testServer) post(user int, token string, activity int64) (status int, ctype string, body []byte, err error) {
	post, _ := http.NewRequest(http.MethodPost, ts.URL+"/api/signup", strings.NewReader(fmt.Sprintf(`{"activityId": %d}`, activity)))
	post.Header.Set("X-User", strconv.Itoa(user))
	post.Header.Set("Idempotency-Key", `"`+token+`"`)
	res, err := http.DefaultClient.Do(post)
	if err != nil {
		return 0, "", nil, err
	}
	defer res.Body.Close()
	body, err = io.ReadAll(res.Body)
	return res.StatusCode, res.Header.Get("Content-Type"), body, err
}

// A sign-up to an activity that does not exist is a 404 problem that quotes
// no SQL, not a 500 with the foreign key's error.
func TestSignupUnknownActivity(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		status, ctype, body := ts.signUp(t, 1, 999999999)
		if status != http.StatusNotFound || ctype != "application/problem+json" {
			t.Fatalf("%d %s: %s", status, ctype, body)
		}
		var p struct{ Code, Detail string }
		if err := json.Unmarshal(body, &p); err != nil || p.Code != "activity-not-found" {
			t.Fatalf("%s (%v)", body, err)
		}
		for _, leak := range []string{"violates", "foreign key", "SQLSTATE", "signups", "activities"} {
			if strings.Contains(string(body), leak) {
				t.Errorf("the answer quotes %q: %s", leak, body)
			}
		}
	})
}

// A full activity refuses newcomers (422, recorded like any refusal) and
// still answers "already signed up" to those who hold a seat.
func TestSignupFull(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		exampletest.Exec(t, ts.app.db, `UPDATE activities SET seats = 1 WHERE id = ?`, ts.app.activityID)
		for _, step := range []struct {
			user, want int
		}{{1, http.StatusCreated}, {2, http.StatusUnprocessableEntity}, {1, http.StatusOK}} {
			status, _, body := ts.signUp(t, step.user, ts.app.activityID)
			if status != step.want {
				t.Fatalf("user %d: %d %s, want %d", step.user, status, body, step.want)
			}
		}
		if n := ts.signups(t, 1) + ts.signups(t, 2); n != 1 {
			t.Fatalf("%d sign-ups for one seat", n)
		}
	})
}

// Five users sign up at once for the last seat: one gets it, the others
// are told the activity is full, and the table holds one sign-up. Run a few
// times, so that some of the sign-ups wait for the first one's lock.
func TestSignupLastSeatConcurrently(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b)
		ctx := context.Background()
		for round := range 5 {
			activity, err := ts.app.store.addActivity(ctx, "last seat", "", 1)
			if err != nil {
				t.Fatal(err)
			}
			tokens := map[int]string{}
			for user := 1; user <= 5; user++ {
				tokens[user] = ts.token(t, user)
			}
			statuses := make(chan int, 5)
			var wg sync.WaitGroup
			for user, token := range tokens {
				wg.Go(func() {
					status, _, body, err := ts.post(user, token, activity)
					if err != nil || (status != http.StatusCreated && status != http.StatusUnprocessableEntity) {
						t.Errorf("round %d, user %d: %d %s %v", round, user, status, body, err)
					}
					statuses <- status
				})
			}
			wg.Wait()
			close(statuses)
			created, full := 0, 0
			for s := range statuses {
				switch s {
				case http.StatusCreated:
					created++
				case http.StatusUnprocessableEntity:
					full++
				}
			}
			rows := exampletest.Count(t, ts.app.db, `SELECT count(*) FROM signups WHERE activity_id = ?`, activity)
			taken := exampletest.Count(t, ts.app.db, `SELECT taken FROM activities WHERE id = ?`, activity)
			if created != 1 || full != 4 || rows != 1 || taken != 1 {
				t.Fatalf("round %d: %d created, %d full, %d rows, taken %d; want 1, 4, 1, 1", round, created, full, rows, taken)
			}
		}
	})
}

// A start on a port that is taken fails before it writes anything: no new
// activity, and no "listening on".
func TestRunPortTaken(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
		ts := newTestServer(t, b) // makes the tables
		activities := func() int {
			t.Helper()
			return exampletest.Count(t, ts.app.db, `SELECT count(*) FROM activities`)
		}
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer taken.Close()
		before := activities()
		var out strings.Builder
		if err := run(context.Background(), taken.Addr().String(), b.URL, b.Tables, &out); err == nil {
			t.Fatal("run served on a port that is taken")
		}
		if out.Len() > 0 {
			t.Errorf("run announced %q", out.String())
		}
		if after := activities(); after != before {
			t.Fatalf("activities went from %d to %d: the failed start wrote", before, after)
		}
	})
}

// run says where it listens once it does, and then where its tables are,
// serves there, and stops when its context is done.
func TestRunServes(t *testing.T) {
	exampletest.OnEach(t, schema, func(t *testing.T, b exampletest.Backend) {
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
		url, _, _ = strings.Cut(url, " ")
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
