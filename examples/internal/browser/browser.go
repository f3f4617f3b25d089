// Package browser starts the machine's Chromium for the examples' page
// tests: headless, without a sandbox (the tests may run as root), with its
// background networking off (this machine's network is closed), in a fresh
// profile. Without Chromium the tests fail with a message saying how to
// install it; they never skip.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// Path is where Debian's chromium package puts the browser.
const Path = "/usr/bin/chromium"

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
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("starting Chromium: %v", err)
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
