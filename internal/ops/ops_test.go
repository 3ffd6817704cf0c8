package ops

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/meshfed/meshfed/internal/connlimit"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

func TestDurationAndDecodeStrict(t *testing.T) {
	var v struct {
		A Duration `json:"a"`
		B Duration `json:"b"`
	}
	if err := DecodeStrict([]byte("a: 1m30s\nb: soon\n"), &v); err != nil {
		t.Fatal(err)
	}
	if v.A.Duration != 90*time.Second || v.A.Check("a") != nil {
		t.Errorf("a = %v", v.A)
	}
	if err := v.B.Check("b"); err == nil || !strings.HasPrefix(err.Error(), `b: "soon" is not a duration`) {
		t.Errorf("b: %v", err)
	}
	if err := DecodeStrict([]byte("a: 1s\nc: 2\n"), &v); err == nil || !strings.Contains(err.Error(), `unknown field "c"`) {
		t.Errorf("unknown field: %v", err)
	}
	if err := DecodeStrict([]byte("a: 1s\na: 2s\n"), &v); err == nil || !strings.Contains(err.Error(), "not valid YAML") {
		t.Errorf("duplicate key: %v", err)
	}
	var neg struct{ N Duration }
	_ = DecodeStrict([]byte(`{"N": "-1s"}`), &neg)
	if err := neg.N.Check("n"); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Errorf("negative: %v", err)
	}
}

func TestServeHTTP(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	mux := http.NewServeMux()
	AddPprof(mux)
	guard, lis := guarded(t, "http")
	addr := ServeHTTP(gctx, g, lis, mux)
	c := &http.Client{Transport: &http.Transport{}}
	resp, err := c.Get("http://" + addr + "/debug/pprof/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("pprof: %v %v", resp, err)
	}
	resp.Body.Close()
	// The kept-alive connection has begun a request: past its handshake, not pending.
	if open, pending := guard.Counts(); open != 1 || pending != 0 {
		t.Errorf("after a request: %d connections open, %d pending; want 1, 0", open, pending)
	}
	c.CloseIdleConnections()
	cancel()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// guarded is a loopback listener through a Guard of its own.
func guarded(t *testing.T, name string) (*connlimit.Guard, net.Listener) {
	t.Helper()
	g, err := Connections{HandshakeTimeout: D(10 * time.Second), MaxPendingPerIP: 4}.Guard(testlog.New(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := g.Listen(name, "127.0.0.1:0", connlimit.ListenerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return g, lis
}

func TestConnectionsCheck(t *testing.T) {
	var bad Duration
	if err := bad.UnmarshalJSON([]byte(`"soon"`)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    Connections
		want string
	}{
		{Connections{HandshakeTimeout: D(time.Second), MaxPendingPerIP: 1, MaxConnections: 1}, ""},
		{Connections{}, ""},
		{Connections{HandshakeTimeout: bad}, "limits.handshakeTimeout: "},
		{Connections{MaxPendingPerIP: -1}, "limits.maxPendingPerIP: -1 is negative"},
		{Connections{MaxConnections: -1}, "limits.maxConnections: -1 is negative"},
	} {
		err := tc.c.Check("limits")
		if (tc.want == "") != (err == nil) || err != nil && !strings.HasPrefix(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.c, err, tc.want)
		}
	}
}

// ServeHTTPS serves over TLS with the configuration given: a handler sees the client's
// certificate, and a refused handshake is in the structured log (at debug) with the peer's
// address.
func TestServeHTTPS(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ca")
	bundle := filepath.Join(dir, "ca.crt")
	tlstest.WriteBundle(t, bundle, ca)
	cert, key, _ := ca.Issue(t, dir, "server", "127.0.0.1")
	ccert, ckey, _ := ca.Issue(t, dir, "client", "spiffe://mesh.test/operator/alice")
	server, err := meshtls.NewSource(meshtls.Files{Cert: cert, Key: key, CA: bundle}, testlog.New(t))
	if err != nil {
		t.Fatal(err)
	}
	var logged syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	mux := http.NewServeMux()
	mux.HandleFunc("/who", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, r.TLS.PeerCertificates[0].URIs[0])
	})
	guard, lis := guarded(t, "adminTLS")
	addr := ServeHTTPS(gctx, g, lis, mux, server.ServerConfig(), slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	get := func(files meshtls.Files) (string, error) {
		client, err := meshtls.NewSource(files, testlog.New(t))
		if err != nil {
			t.Fatal(err)
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: client.ClientConfig("")}}
		defer c.CloseIdleConnections()
		resp, err := c.Get("https://" + addr + "/who")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		// The connection has completed its TLS handshake and begun a request.
		if _, pending := guard.Counts(); pending != 0 {
			t.Errorf("during a request over TLS: %d connections pending, want 0", pending)
		}
		return string(b), err
	}
	if got, err := get(meshtls.Files{Cert: ccert, Key: ckey, CA: bundle}); err != nil || got != "spiffe://mesh.test/operator/alice" {
		t.Errorf("with a client certificate: %q, %v", got, err)
	}
	// A client whose certificate another CA issued: refused at the handshake.
	other := tlstest.NewCA(t, "other")
	ocert, okey, _ := other.Issue(t, dir, "stranger", "spiffe://mesh.test/operator/mallory")
	if _, err := get(meshtls.Files{Cert: ocert, Key: okey, CA: bundle}); err == nil {
		t.Error("a certificate of another CA was served")
	}
	testwait.For(t, 5*time.Second, "the refused handshake in the log, at debug (the TLS configuration reports refusals)", func() bool {
		return strings.Contains(logged.String(), `level=DEBUG msg="http: TLS handshake error from 127.0.0.1:`)
	})
	cancel()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
}

// syncBuffer is a bytes.Buffer for a logger that goroutines write to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// watched is WatchFile running on a file until the test ends.
type watched struct {
	t  *testing.T
	mu sync.Mutex
	// got are the contents changed was called with; log is what WatchFile logged.
	got []string
	log bytes.Buffer
}

func watch(t *testing.T, path string) *watched {
	t.Helper()
	w := &watched{t: t}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(testlog.Writer(t, ""), lockedWriter{&w.mu, &w.log}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- WatchFile(ctx, path, time.Millisecond, log, func(data []byte) {
			w.mu.Lock()
			defer w.mu.Unlock()
			w.got = append(w.got, string(data))
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("WatchFile: %v", err)
		}
	})
	return w
}

// calls waits until changed has been called len(want) times and checks it was with want, in
// order.
func (w *watched) calls(want ...string) {
	w.t.Helper()
	got := func() []string {
		w.mu.Lock()
		defer w.mu.Unlock()
		return slices.Clone(w.got)
	}
	testwait.For(w.t, 10*time.Second, fmt.Sprintf("calls with %q", want), func() bool { return len(got()) >= len(want) })
	if g := got(); !slices.Equal(g, want) {
		w.t.Fatalf("called with %q, want %q", g, want)
	}
}

// unchanged returns how many times the file was read and found as last passed.
func (w *watched) unchanged() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Count(w.log.String(), "configuration file unchanged")
}

// waitUnchanged waits until the file has been found unchanged n times in all: what was done
// to it since has been seen, and is not merged into the next change's burst.
func (w *watched) waitUnchanged(n int) {
	w.t.Helper()
	testwait.For(w.t, 10*time.Second, fmt.Sprintf("%d reads of an unchanged file", n), func() bool { return w.unchanged() >= n })
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// replace writes content to path by a rename, as editors and `mv` do: a reader never sees
// the file half-written.
func replace(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// Writes to another file of the directory call nothing, and do not even read the file.
func TestWatchFileIgnoresOtherFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "hub.yaml")
	replace(t, path, "v1")
	w := watch(t, path)
	w.calls("v1")
	log, err := os.OpenFile(filepath.Join(dir, "hub.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	for range 100 {
		if _, err := log.WriteString("a line\n"); err != nil {
			t.Fatal(err)
		}
	}
	replace(t, filepath.Join(dir, "other.yaml"), "v2")
	// Events come in order: once this change is seen, the ones above have been.
	replace(t, path, "v2")
	w.calls("v1", "v2")
	if n := w.unchanged(); n != 0 {
		t.Errorf("the file was read %d times for other files' events", n)
	}
}

// The file written again with the same bytes (in place, or replaced), touched or chmodded
// calls nothing.
func TestWatchFileIgnoresTheSameBytes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.yaml")
	replace(t, path, "v1")
	w := watch(t, path)
	w.calls("v1")
	f, err := os.OpenFile(path, os.O_WRONLY, 0) // not truncated: never read half-written
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("v1"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	w.waitUnchanged(1)
	replace(t, path, "v1")
	w.waitUnchanged(2)
	if now := time.Now(); os.Chtimes(path, now, now) != nil {
		t.Fatal("touch")
	}
	w.waitUnchanged(3)
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	w.waitUnchanged(4)
	replace(t, path, "v2")
	w.calls("v1", "v2")
}

// Each distinct content is passed once, after its burst of events settles.
func TestWatchFileOncePerContent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.yaml")
	replace(t, path, "v1")
	w := watch(t, path)
	w.calls("v1")
	replace(t, path, "v2")
	w.calls("v1", "v2")
	replace(t, path, "v2")
	w.waitUnchanged(1)
	replace(t, path, "v3")
	w.calls("v1", "v2", "v3")
	replace(t, path, "v1") // not the last one passed: a change
	w.calls("v1", "v2", "v3", "v1")
}

// A Kubernetes ConfigMap mount: the file is a symlink through ..data, which the kubelet swaps
// atomically to a new timestamped directory.
func TestWatchFileConfigMapSwap(t *testing.T) {
	dir := t.TempDir()
	version := func(ts, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, ts), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ts, "hub.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(ts, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_a", "v1")
	path := filepath.Join(dir, "hub.yaml")
	if err := os.Symlink(filepath.Join("..data", "hub.yaml"), path); err != nil {
		t.Fatal(err)
	}
	w := watch(t, path)
	w.calls("v1")
	version("..2026_b", "v2")
	if err := os.RemoveAll(filepath.Join(dir, "..2026_a")); err != nil {
		t.Fatal(err)
	}
	w.calls("v1", "v2")
}

// An editor's save by rename is seen: a new file moved over the old one, or the old one moved
// away and a new one created under the name (a link here, so it is never read half-written).
func TestWatchFileRenameReplace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.yaml")
	replace(t, path, "v1")
	w := watch(t, path)
	w.calls("v1")
	replace(t, path, "v2")
	w.calls("v1", "v2")
	if err := os.Rename(path, path+"~"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+".new", []byte("v3"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(path+".new", path); err != nil {
		t.Fatal(err)
	}
	w.calls("v1", "v2", "v3")
}

func TestLoadFileAndLogger(t *testing.T) {
	path := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(path, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadFile(path, func([]byte) (int, error) { return 0, fmt.Errorf("bad field") })
	if err == nil || err.Error() != path+": bad field" {
		t.Errorf("LoadFile: %v", err)
	}
	if v, err := LoadFile(path, func(b []byte) (string, error) { return string(b), nil }); v != "x" || err != nil {
		t.Errorf("LoadFile = %q, %v", v, err)
	}
	if _, err := NewLogger(io.Discard, "loud", "json"); err == nil || !strings.Contains(err.Error(), `"loud"`) {
		t.Errorf("NewLogger(loud): %v", err)
	}
	if l, err := NewLogger(io.Discard, "warn", "json"); err != nil || l.Enabled(context.Background(), slog.LevelInfo) {
		t.Errorf("NewLogger(warn): %v", err)
	}
}

func TestOverlay(t *testing.T) {
	type section struct {
		N     int
		F     float64
		D     Duration
		Off   bool
		Names []string
	}
	base := section{N: 1, F: 0.5, D: D(time.Second), Names: []string{"a"}}
	if got := Overlay(base, nil); !reflect.DeepEqual(got, base) {
		t.Errorf("Overlay(base, nil) = %+v, want base", got)
	}
	got := Overlay(base, &section{F: 0.25, Off: true})
	want := section{N: 1, F: 0.25, D: D(time.Second), Off: true, Names: []string{"a"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Overlay = %+v, want %+v (the fields set replace, the others stay)", got, want)
	}
	if got := Overlay(base, &section{D: D(time.Minute), Names: []string{"b"}}); got.D.Duration != time.Minute || got.Names[0] != "b" || got.N != 1 {
		t.Errorf("Overlay of a duration and a list = %+v", got)
	}
}

// NewLogger writes JSON by default and key=value text for people; a format or level it does
// not know is an error naming the choices.
func TestNewLogger(t *testing.T) {
	var b bytes.Buffer
	for format, want := range map[string]string{"json": `"msg":"hello"`, "text": "msg=hello"} {
		b.Reset()
		log, err := NewLogger(&b, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		log.Debug("hidden")
		log.Info("hello")
		if !strings.Contains(b.String(), want) || strings.Contains(b.String(), "hidden") {
			t.Errorf("%s: %q", format, b.String())
		}
	}
	if _, err := NewLogger(&b, "info", "xml"); err == nil || err.Error() != `log format "xml": want json or text` {
		t.Errorf("xml: %v", err)
	}
	if _, err := NewLogger(&b, "loud", "json"); err == nil || !strings.Contains(err.Error(), `log level "loud"`) {
		t.Errorf("loud: %v", err)
	}
}
