package test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/ortbus/ortbus/internal/testkit/testenv"
)

// The browser of the page's tests (page_test.go): a headless Chromium (Debian's
// chromium, which .ci/run installs through scripts/install-chromium.sh) driven over the
// DevTools protocol by chromedp. Under CI (CI set, e.g. CI=true: testenv.Unavailable, as for the
// Vulkan tests) a missing Chromium fails the test; elsewhere it skips, saying what to install.

// browserBound bounds one wait of a page test on the browser: a failure, never a timing.
const browserBound = 30 * time.Second

// chromiumPath is the Chromium to run: $ORTBUS_CHROMIUM, else the first of the usual
// names on $PATH.
func chromiumPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("ORTBUS_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Unavailable(t, "no Chromium on $PATH: install Debian's chromium (scripts/install-chromium.sh, as root) or set ORTBUS_CHROMIUM")
	return ""
}

// startBrowser starts a headless Chromium for t and returns the context of its first
// tab; the browser (and every process it started) is stopped when t ends.
func startBrowser(t testing.TB) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromiumPath(t)),
		chromedp.WindowSize(1280, 1100),
		chromedp.Flag("hide-scrollbars", true),
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first run starts the browser, which lives as long as the context of that run:
	// ctx itself, not one with a deadline.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx
}

// newTab opens a tab of the browser whose context is browser, closed when t ends.
func newTab(t testing.TB, browser context.Context) context.Context {
	t.Helper()
	ctx, cancel := chromedp.NewContext(browser)
	t.Cleanup(cancel)
	// The first run opens the tab, which lives as long as the context of that run: ctx
	// itself, not one with a deadline (inBrowser's).
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return ctx
}

// inBrowser runs actions on tab within browserBound, failing t with what with their error
// and the page's main part.
func inBrowser(t testing.TB, tab context.Context, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserBound)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		dump, done := context.WithTimeout(tab, 5*time.Second)
		defer done()
		html, _ := chromedp.Run(dump, chromedp.OuterHTML(chromedp.CSS("main")))
		t.Fatalf("%s: %v\nthe page's main:\n%s", what, err, html)
	}
}

// waitTrue waits until the JavaScript expression expr is true on the tab's page,
// polling it every pollEvery (the wait is bounded by inBrowser's context).
func waitTrue(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(pollEvery), chromedp.WithPollingTimeout(0))
}

// evalIn evaluates the JavaScript expression expr on tab's page into a T.
func evalIn[T any](t testing.TB, tab context.Context, expr string) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(tab, browserBound)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// screenshot saves a PNG of the tab's page as name in $ORTBUS_SCREENSHOT_DIR (a temporary
// directory of t without it), and logs where.
func screenshot(t testing.TB, tab context.Context, name string) {
	t.Helper()
	dir := os.Getenv("ORTBUS_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	ctx, cancel := context.WithTimeout(tab, browserBound)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
}
