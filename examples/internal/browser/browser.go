// Package browser starts the machine's Chromium for the examples' page
// tests: headless, without a sandbox (the tests may run as root), with its
// background networking off (this machine's network is closed), in a fresh
// profile, with a viewport of a desktop's size, and with the pages in the
// fonts the README's install line gives (fonts-liberation), whatever else
// the machine has. Without Chromium the tests fail with a message saying how
// to install it; they never skip.
package browser

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/css"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// Path is where Debian's chromium package puts the browser.
const Path = "/usr/bin/chromium"

// Width and Height are the size of the page's viewport: a desktop's.
const (
	Width  = 1280
	Height = 900
)

// Sans and Mono are the fonts every page test renders the pages in: those
// of the README's install line, apt-get install chromium fonts-liberation,
// so that the tests and the screenshots see what a reader who followed the
// README sees, and not the fonts this machine may have besides (the
// stylesheet lists Inter first).
const (
	Sans = "Liberation Sans"
	Mono = "Liberation Mono"
)

// readmeFonts is the style that sets the stylesheet's font variables to
// Sans and Mono; New adds it to every page as it loads.
const readmeFonts = `:root { --sans: "` + Sans + `", sans-serif !important; --mono: "` + Mono + `", monospace !important; }`

// addReadmeFonts is the script New runs in every new document: it adds
// readmeFonts as the style element #readme-fonts, which Fits turns off and
// on again.
const addReadmeFonts = `document.addEventListener("DOMContentLoaded", () => {
  const s = document.createElement("style");
  s.id = "readme-fonts";
  s.textContent = ` + "`" + readmeFonts + "`" + `;
  document.head.append(s);
});`

// New returns a chromedp context with a started browser, closed at the end
// of the test.
func New(t *testing.T) context.Context {
	t.Helper()
	path := Path
	if p := os.Getenv("CHROMIUM"); p != "" {
		path = p
	}
	if _, err := exec.LookPath(path); err != nil {
		t.Fatalf("Chromium is not installed at %s (apt-get install chromium, or set CHROMIUM): %v", path, err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	t.Cleanup(func() { // runs first: the browser is still up
		if t.Failed() {
			screenshot(t, ctx)
		}
	})
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank"), chromedp.EmulateViewport(Width, Height)); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{Source: addReadmeFonts}); err != nil {
		t.Fatalf("setting the pages' fonts: %v", err)
	}
	return ctx
}

// screenshot saves the page as a PNG for a failed test, in
// $IDEM_SCREENSHOT_DIR or the system's temporary directory.
func screenshot(t *testing.T, ctx context.Context) {
	shotCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	png, err := chromedp.Run(shotCtx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Logf("no screenshot: %v", err)
		return
	}
	dir := os.Getenv("IDEM_SCREENSHOT_DIR")
	if dir == "" {
		dir = os.TempDir()
	}
	name := filepath.Join(dir, "idem-"+strings.ReplaceAll(t.Name(), "/", "_")+".png")
	if err := os.WriteFile(name, png, 0o644); err != nil {
		t.Logf("no screenshot: %v", err)
		return
	}
	t.Logf("screenshot of the page: %s", name)
}

// SaveScreenshot saves the page as the browser shows it (Width x Height, in
// the README's fonts) to path, when IDEM_SCREENSHOTS is set: the pictures of
// the pages in docs/images are made this way. Without the variable it does
// nothing, so that a test run leaves the working tree as it was.
func SaveScreenshot(t *testing.T, ctx context.Context, path string) {
	t.Helper()
	if os.Getenv("IDEM_SCREENSHOTS") == "" {
		return
	}
	requireFont(t, ctx, ".panel h2", Sans)
	// Let the page's highlights fade and its fonts settle first.
	time.Sleep(1500 * time.Millisecond)
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	t.Logf("screenshot of the page: %s", path)
}

// WaitState waits until the page's #status element has data-state in one of
// states, and returns the state and the status text.
func WaitState(t *testing.T, ctx context.Context, timeout time.Duration, states ...string) (string, string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var state, text string
	for time.Now().Before(deadline) {
		var err error
		state, err = chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("status")?.dataset.state || ""`))
		if err == nil {
			for _, s := range states {
				if state == s {
					text, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("status").textContent`))
					return state, text
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	text, _ = chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById("status")?.textContent || ""`))
	t.Fatalf("the page did not reach %v within %v; it is %q: %q", states, timeout, state, text)
	return "", ""
}

// Wait waits until the JavaScript expression js is true in the page, and
// fails the test, quoting js, if it is not within timeout.
func Wait(t *testing.T, ctx context.Context, timeout time.Duration, js string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool]("Boolean("+js+")"))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the page did not get to %s within %v (%v)", js, timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Request is a row of the request panel of the examples' pages (the #log
// table that their panel.js fills).
type Request struct {
	Method string `json:"method"`
	Path   string `json:"path"`
	// Key is the Idempotency-Key, "" for none.
	Key string `json:"key"`
	// Status is the HTTP status, "pending" while the request is on its
	// way, "no-response" when none came, "offline" when the page's offline
	// switch kept it from being sent.
	Status string `json:"status"`
	// Replayed is the Idempotent-Replayed header, "" when absent.
	Replayed string `json:"replayed"`
}

// Requests returns the rows of the page's request panel, oldest first.
func Requests(t *testing.T, ctx context.Context) []Request {
	t.Helper()
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]Request](`[...document.querySelectorAll("#log tr[data-method]")].map((tr) => ({
  method: tr.dataset.method, path: tr.dataset.path, key: tr.dataset.key,
  status: tr.dataset.status, replayed: tr.dataset.replayed,
}))`))
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// Click clicks the element sel names.
func Click(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Click(sel)); err != nil {
		t.Fatal(err)
	}
}

// DoubleClick clicks the page's submit button twice in a row, as a quick
// double click does. (chromedp.DoubleClick sends one click with a click
// count of 2, which fires a single click event.)
func DoubleClick(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`(() => { const b = document.getElementById("submit"); b.click(); b.click(); return true; })()`)); err != nil {
		t.Fatal(err)
	}
}

// GoOffline turns the panel's offline switch on, for longer than the test
// takes, so that the test, not the clock, brings the page back online.
func GoOffline(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.getElementById("go-offline").dataset.seconds = 600`)); err != nil {
		t.Fatal(err)
	}
	Click(t, ctx, "#go-offline")
}

// WaitRows waits until the panel shows n rows in the database.
func WaitRows(t *testing.T, ctx context.Context, n int) {
	t.Helper()
	Wait(t, ctx, 10*time.Second, fmt.Sprintf(`document.getElementById("rows").dataset.rows === "%d"`, n))
}

// DroppedThenReplayed checks that the panel shows two POSTs with one key:
// the first with no response (the server dropped it after committing), the
// second a 201 marked Idempotent-Replayed: true. It returns the key.
func DroppedThenReplayed(t *testing.T, ctx context.Context) string {
	t.Helper()
	var posts []Request
	for _, r := range Requests(t, ctx) {
		if r.Method == http.MethodPost {
			posts = append(posts, r)
		}
	}
	if len(posts) != 2 {
		t.Fatalf("the panel shows %d POSTs, want the dropped one and its resend: %+v", len(posts), posts)
	}
	first, resend := posts[0], posts[1]
	if first.Status != "no-response" || first.Replayed != "" {
		t.Errorf("the dropped POST shows as %+v", first)
	}
	if first.Key == "" || resend.Key != first.Key {
		t.Errorf("the resend's key %q is not the first's %q", resend.Key, first.Key)
	}
	if resend.Status != "201" || resend.Replayed != "true" {
		t.Errorf("the resend shows as %+v, want 201 replayed", resend)
	}
	return first.Key
}

// Fits fails the test if a cell of the request panel's table (#log's) is
// clipped: its text wider than the cell, or the table wider than the box
// that scrolls it, which cuts off the last column. It checks the page in
// the fonts the stylesheet picks on this machine (the system's, or Inter),
// with the README's turned off for a moment, and then in the README's fonts,
// Sans and Mono, and fails, saying how to install them, if those are not
// the ones the page is drawn in.
func Fits(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, f := range []struct {
		fonts string
		on    bool
	}{{"the stylesheet's own choice of this machine's fonts", false}, {"the README's fonts", true}} { // the README's last: a screenshot follows
		// Reading offsetWidth lays the page out again in the fonts now set.
		js := fmt.Sprintf(`(document.getElementById("readme-fonts").disabled = %v, document.body.offsetWidth)`, !f.on)
		if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](js)); err != nil {
			t.Fatalf("switching the fonts: %v", err)
		}
		if f.on {
			requireFont(t, ctx, ".log th", Sans)
			requireFont(t, ctx, "#log .badge", Mono)
		}
		clipped, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](clippedCells))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range clipped {
			t.Errorf("at %dx%d in %s, %s", Width, Height, f.fonts, c)
		}
	}
}

// clippedCells lists the cells of the request table whose text does not
// show whole: wider than the cell's content box, or past the right edge of
// the .log-wrap box that scrolls the table.
const clippedCells = `(() => {
  const wrap = document.querySelector(".log-wrap");
  const box = wrap.getBoundingClientRect();
  const visible = box.left + wrap.clientLeft + wrap.clientWidth;
  const out = [];
  if (wrap.scrollWidth > wrap.clientWidth) {
    out.push("the table is " + wrap.scrollWidth + "px wide in a box of " + wrap.clientWidth + "px");
  }
  for (const cell of document.querySelectorAll(".log th, .log td")) {
    if (getComputedStyle(cell).display === "none" || cell.textContent.trim() === "") continue;
    const range = document.createRange();
    range.selectNodeContents(cell);
    const text = range.getBoundingClientRect();
    const r = cell.getBoundingClientRect();
    const s = getComputedStyle(cell);
    const right = Math.min(r.right - parseFloat(s.paddingRight), visible);
    if (cell.scrollWidth > cell.clientWidth || text.right > right + 0.5) {
      out.push("the cell " + JSON.stringify(cell.textContent.trim()) + " is clipped: its text ends at " +
        text.right.toFixed(1) + "px, the cell shows up to " + right.toFixed(1) + "px");
    }
  }
  return out;
})()`

// requireFont fails the test unless the text of the first element sel
// names is drawn in the font family, as Chromium reports the platform font
// it used.
func requireFont(t *testing.T, ctx context.Context, sel, family string) {
	t.Helper()
	nodes, err := chromedp.Run(ctx, chromedp.Nodes(chromedp.CSS(sel)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := chromedp.Call(ctx, css.GetPlatformFontsForNode, css.GetPlatformFontsForNodeParams{NodeID: nodes[0].NodeID})
	if err != nil {
		t.Fatal(err)
	}
	var used []string
	for _, f := range res.Fonts {
		if f.FamilyName == family {
			return
		}
		used = append(used, f.FamilyName)
	}
	t.Fatalf("%s is drawn in %v, not %s: apt-get install fonts-liberation", sel, used, family)
}
