// Package browsertest drives a real headless browser for tests of the hub's dashboard:
// Debian's chromium, through the DevTools protocol (github.com/chromedp/chromedp, a Go
// client of that protocol, so no Node and no WebDriver). Everything the page does wrong is
// a failure of the test: a JavaScript exception, a console error, an error in the
// browser's log (a failed request, a Content-Security-Policy violation), and a request to
// any host that is not loopback.
//
// Without chromium a test skips, loudly, unless the environment variable CI or
// MESHFED_REQUIRE_BROWSER is set: then it fails, since CI installs chromium (.ci/run) and a
// browser test that quietly skips there tests nothing.
//
// It is not a page-object library: tests say what they look for with CSS selectors and
// JavaScript predicates, and wait for them with a bound.
package browsertest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// RequireEnv are the environment variables that make a missing browser a failure.
var RequireEnv = []string{"CI", "MESHFED_REQUIRE_BROWSER"}

// executables are the browsers looked for on PATH, Debian's first.
var executables = []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"}

// Browser is one headless browser with one tab, until its test ends.
type Browser struct {
	ctx context.Context

	mu       sync.Mutex // guards problems
	problems []string
}

// New starts a browser for t, stopped when t ends; at the end, everything the page did
// wrong fails t. Without a browser, t is skipped or failed (see the package doc).
//
// Call it after starting the servers the page visits: cleanups run last in, first out, so
// the browser then stops before they do (a page whose server went away logs errors).
func New(t testing.TB) *Browser {
	t.Helper()
	path := find()
	if path == "" {
		msg := fmt.Sprintf("no browser on PATH (looked for %s): install Debian's chromium (apt-get install chromium) to run the dashboard's browser tests", strings.Join(executables, ", "))
		for _, env := range RequireEnv {
			if os.Getenv(env) != "" {
				t.Fatalf("%s; %s is set, so this is a failure", msg, env)
			}
		}
		t.Skipf("SKIPPED: %s (set %s to make this a failure)", msg, strings.Join(RequireEnv, " or "))
	}
	// The profile, removed after the browser has stopped (its helpers may write to it a
	// moment longer).
	dir, err := os.MkdirTemp("", "browsertest-")
	if err != nil {
		t.Fatal(err)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(dir),
		chromedp.NoSandbox, // tests run as root in containers, where the sandbox cannot start
		chromedp.DisableGPU,
		chromedp.WindowSize(1440, 1000),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	b := &Browser{ctx: ctx}
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx)
		cancel()
		cancelAlloc()
		for range 50 {
			if os.RemoveAll(dir) == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, p := range b.Problems() {
			t.Errorf("the page: %s", p)
		}
	})
	if err := chromedp.Listen(ctx, b.watch); err != nil {
		t.Fatalf("starting %s: %v", path, err)
	}
	return b
}

func find() string {
	for _, name := range executables {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// watch notes what the page does wrong. It runs on the browser's reading goroutine, so it
// only appends.
func (b *Browser) watch(ev any) {
	var p string
	switch ev := ev.(type) {
	case *runtime.EventExceptionThrown:
		p = "JavaScript exception: " + (&chromedp.ExceptionError{ExceptionDetails: ev.ExceptionDetails}).Error()
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range ev.Args {
				if a.Value != nil {
					args = append(args, string(a.Value))
				} else {
					args = append(args, a.Description)
				}
			}
			p = fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " "))
		}
	case *log.EventEntryAdded:
		if ev.Entry.Level == log.EntryLevelError {
			p = fmt.Sprintf("browser log error (%s): %s %s", ev.Entry.Source, ev.Entry.Text, ev.Entry.URL)
		}
	case *network.EventRequestWillBeSent:
		if !Loopback(ev.Request.URL) {
			p = "request to a host that is not loopback: " + ev.Request.URL
		}
	}
	if p != "" {
		b.mu.Lock()
		b.problems = append(b.problems, p)
		b.mu.Unlock()
	}
}

// Loopback reports whether a request to u stays on this machine: a URL of 127.0.0.0/8,
// ::1 or localhost, or one that names no host at all (data:, blob:, about:).
func Loopback(u string) bool {
	parsed, err := url.Parse(u)
	if err != nil {
		return false
	}
	switch parsed.Scheme {
	case "data", "blob", "about":
		return true
	}
	host := parsed.Hostname()
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// Problems returns what the page did wrong so far.
func (b *Browser) Problems() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.problems...)
}

// Do runs steps in the tab, failing t if one fails.
func (b *Browser) Do(t testing.TB, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		t.Fatalf("browser: %v", err)
	}
}

// Eval returns the value of the JavaScript expression js in the page.
func Eval[T any](t testing.TB, b *Browser, js string) T {
	t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("browser: evaluating %s: %v", js, err)
	}
	return v
}

// WaitFor waits up to d for the JavaScript expression js to be truthy in the page, failing
// t with what as the thing it waited for (and the page's text of the main element).
func (b *Browser) WaitFor(t testing.TB, d time.Duration, what, js string) {
	t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[chromedp.Void](js, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(d))); err != nil {
		text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("browser: waiting %v for %s (%s): %v\nthe page says:\n%s", d, what, js, err, text)
	}
}

// Screenshot writes the whole page as .cache/screenshots/NAME.png at the module's root,
// for people to look at, and returns the path.
func (b *Browser) Screenshot(t testing.TB, name string) string {
	t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100)) // quality 100 is PNG; below, JPEG
	if err != nil {
		t.Fatalf("browser: screenshot %s: %v", name, err)
	}
	dir := filepath.Join(moduleRoot(t), ".cache", "screenshots")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s", path)
	return path
}

// moduleRoot is the directory of the go.mod above the test's working directory.
func moduleRoot(t testing.TB) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// LoopbackURL is the URL of a listener's address for the browser: http://ADDR with a
// loopback address (a listener on 0.0.0.0 is reached at 127.0.0.1).
func LoopbackURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err == nil && (host == "" || host == "0.0.0.0" || host == "::") {
		addr = net.JoinHostPort("127.0.0.1", port)
	}
	return "http://" + addr
}
