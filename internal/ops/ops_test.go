package ops

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
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

func TestServeHTTPAndWatchFile(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	mux := http.NewServeMux()
	AddPprof(mux)
	addr, err := ServeHTTP(gctx, g, "127.0.0.1:0", mux)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("pprof: %v %v", resp, err)
	}
	resp.Body.Close()

	dir := t.TempDir()
	path := filepath.Join(dir, "c.yaml")
	var calls atomic.Int32
	g.Go(func() error {
		return WatchFile(gctx, path, 10*time.Millisecond, slog.New(slog.NewTextHandler(io.Discard, nil)), func() { calls.Add(1) })
	})
	deadline := time.Now().Add(10 * time.Second)
	for calls.Load() == 0 && time.Now().Before(deadline) {
		_ = os.WriteFile(path, []byte("x"), 0o644) // until the watcher is up and sees one
		time.Sleep(20 * time.Millisecond)
	}
	if calls.Load() == 0 {
		t.Fatal("no change seen")
	}
	cancel()
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
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
	if _, err := Logger(io.Discard, "loud"); err == nil || !strings.Contains(err.Error(), `"loud"`) {
		t.Errorf("Logger(loud): %v", err)
	}
	if l, err := Logger(io.Discard, "warn"); err != nil || l.Enabled(context.Background(), slog.LevelInfo) {
		t.Errorf("Logger(warn): %v", err)
	}
}
