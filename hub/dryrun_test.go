package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	meshtls "github.com/meshfed/meshfed/tls"
)

// Dry runs of a candidate configuration (issue 25, findings 8 and 9). On the code before
// these tests, POST /api/dryrun compiled any caller's candidate: unauthenticated on plain
// http, any verified certificate on adminTLS, a tenant's operator (who was told which of
// the vendor's fields differ: needsRestart); of any size up to 4 MiB, cut there silently;
// any number at once; and the hub went on compiling after the client had gone, for seconds
// (the overlap checks were quadratic).

// candidateYAML is a valid development-mode configuration of clusters clusters, each owning
// patterns namespace patterns (half exact, half prefixes) and as many host patterns, none
// overlapping another cluster's (the overlap checks' worst case: every pair is compared).
// About 4.2 KB per cluster of 100 patterns.
func candidateYAML(clusters, patterns int) []byte {
	var b strings.Builder
	b.WriteString("insecure: true\ningest: 127.0.0.1:0\nserve: 127.0.0.1:0\nhttp: 127.0.0.1:0\ncollections: [istio/networking/v1alpha3/virtualservices]\nrouting: {default: {name: all}}\nclusters:\n")
	for i := range clusters {
		fmt.Fprintf(&b, "- name: c%04d\n  identities: [c%04d]\n  namespaces: [", i, i)
		for j := range patterns {
			if j > 0 {
				b.WriteString(", ")
			}
			if j%2 == 0 {
				fmt.Fprintf(&b, "c%04d-n%04d", i, j)
			} else {
				fmt.Fprintf(&b, "c%04d-p%04d-*", i, j)
			}
		}
		b.WriteString("]\n  hosts: [")
		for j := range patterns {
			if j > 0 {
				b.WriteString(", ")
			}
			if j%2 == 0 {
				fmt.Fprintf(&b, "h%04d.c%04d.example.com", j, i)
			} else {
				fmt.Fprintf(&b, "\"*.w%04d.c%04d.example.com\"", j, i)
			}
		}
		b.WriteString("]\n")
	}
	return []byte(b.String())
}

// post sends body to url with c and returns the answer's status, its Retry-After and body.
func post(t *testing.T, c *http.Client, url string, body io.Reader) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), string(b)
}

// A dry run with a candidate is an operator's action, refused and logged like the others:
// plain http (not development mode) is 401, a sink's certificate on adminTLS 403; an
// operator's certificate is answered, and the log names it. A dry run without a candidate
// stays a read: anyone on http. Before: every one of them was answered (200).
func TestDryRunOfACandidateIsAnOperatorsAction(t *testing.T) {
	p := newPKI(t)
	hubFiles := meshtls.Files{Cert: p.hubCert, Key: p.hubKy}
	yaml := `
tls: {certFile: ` + hubFiles.Cert + `, keyFile: ` + hubFiles.Key + `, caFile: ` + p.bundle + `}
trustDomain: mesh.test
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
adminTLS: 127.0.0.1:0
collections: [istio/networking/v1alpha3/virtualservices]
clusters: [{name: east, namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`
	h, logs := runHub(t, yaml)
	if err := h.Apply("east", vsPush(t, "shop/cart")); err != nil {
		t.Fatal(err)
	}
	_, _, httpAddr := h.Addrs()
	dry := "/api/dryrun?identity=spiffe://mesh.test/sink/istiod-1"
	candidate := strings.Replace(yaml, "namespaces: [shop]", "namespaces: [pay]", 1) // east would lose shop/cart

	for _, tc := range []struct {
		name, id string
		c        *http.Client
		url      string
		status   int
		says     string
	}{
		{"plain http", "none (the http listener carries no certificate)", &http.Client{Timeout: 10 * time.Second}, "http://" + httpAddr + dry,
			http.StatusUnauthorized, "actions need an authenticated operator: a client certificate for spiffe://mesh.test/operator/NAME, over adminTLS"},
		{"a sink's certificate", "spiffe://mesh.test/sink/istiod-1", tlsClient(t, p.files("sink", "spiffe://mesh.test/sink/istiod-1")), "https://" + h.AdminTLSAddr() + dry,
			http.StatusForbidden, `identity "spiffe://mesh.test/sink/istiod-1" is not an operator`},
	} {
		status, _, body := post(t, tc.c, tc.url, strings.NewReader(candidate))
		if status != tc.status || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %q, want %d saying %q", tc.name, status, body, tc.status, tc.says)
		}
		if logs.find("admin action refused", map[string]string{"action": "POST /api/dryrun", "identity": tc.id, "status": fmt.Sprint(tc.status)}) == nil {
			t.Errorf("%s: the refusal is not logged with the identity", tc.name)
		}
	}

	alice := tlsClient(t, p.files("alice", "spiffe://mesh.test/operator/alice"))
	status, _, body := post(t, alice, "https://"+h.AdminTLSAddr()+dry, strings.NewReader(candidate))
	var d api.DryRun
	if status != http.StatusOK || json.Unmarshal([]byte(body), &d) != nil || !d.Candidate || !slices.Equal(d.Removed[vsColl], []string{"shop/cart"}) {
		t.Fatalf("the operator's dry run: %d %s", status, body)
	}
	for _, msg := range []string{"admin action by an operator", "admin action done"} {
		if logs.find(msg, map[string]string{"action": "POST /api/dryrun", "operator": "spiffe://mesh.test/operator/alice"}) == nil {
			t.Errorf("the operator's dry run is not logged (%q) with the operator", msg)
		}
	}

	// Reading what a sink receives now: anyone who reaches http, as before.
	code, body := call(t, &http.Client{Timeout: 10 * time.Second}, http.MethodGet, "http://"+httpAddr+dry, nil)
	if code != http.StatusOK || json.Unmarshal([]byte(body), &d) != nil || d.Candidate || d.Resources[vsColl]["shop/cart"] == "" {
		t.Errorf("GET dry run on http: %d %s", code, body)
	}
}

// With tenants, a dry run of a candidate is the vendor's: a tenant's operator is refused
// (403), told what it may ask instead, and learns nothing of the candidate's evaluation,
// none of the vendor-level fields it changes (needsRestart) first; the vendor's operator
// is answered with them. A tenant's operator still reads what its own sinks receive now.
// Before: ann was answered 200 with needsRestart [serve limits].
func TestDryRunOfACandidateIsTheVendors(t *testing.T) {
	p := newPKI(t)
	hubFiles := meshtls.Files{Cert: p.hubCert, Key: p.hubKy}
	yaml := `
tls: {certFile: ` + hubFiles.Cert + `, keyFile: ` + hubFiles.Key + `, caFile: ` + p.bundle + `}
trustDomain: mesh.test
stateDir: ` + t.TempDir() + `
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
adminTLS: 127.0.0.1:0
collections: [istio/networking/v1alpha3/virtualservices]
operators: [vera]
tenants:
- name: acme
  operators: [ann]
  sinks: ["spiffe://mesh.test/sink/acme-*"]
  clusters: [{name: east, namespaces: [shop], hosts: ["*.shop.example.com"]}]
  routing: {rules: [{name: fleet, identities: ["*"]}]}
- name: globex
  operators: [gus]
  sinks: ["spiffe://mesh.test/sink/globex-*"]
  clusters: [{name: north, namespaces: [bank], hosts: ["*.bank.example.com"]}]
  routing: {rules: [{name: fleet, identities: ["*"]}]}
`
	h, logs := runHub(t, yaml)
	_ = h.Apply("east", vsPush(t, "shop/cart"))
	admin := "https://" + h.AdminTLSAddr()
	ann := tlsClient(t, p.files("ann", "spiffe://mesh.test/operator/ann"))
	vera := tlsClient(t, p.files("vera", "spiffe://mesh.test/operator/vera"))
	dry := admin + "/api/dryrun?identity=spiffe://mesh.test/sink/acme-1"
	candidate := strings.Replace(yaml, "serve: 127.0.0.1:0", "serve: 127.0.0.1:1\nlimits: {streamsPerSecond: 9, streamBurst: 9}", 1)

	status, _, body := post(t, ann, dry, strings.NewReader(candidate))
	if status != http.StatusForbidden || !strings.Contains(body, "a dry run of a candidate configuration is the vendor's") ||
		!strings.Contains(body, `operator "spiffe://mesh.test/operator/ann" of tenant "acme" may ask what its sinks receive now (GET /api/dryrun)`) {
		t.Errorf("ann's dry run of a candidate: %d %q, want 403 saying it is the vendor's", status, body)
	}
	for _, vendorLevel := range []string{"needsRestart", "serve", "limits"} {
		if strings.Contains(body, vendorLevel) {
			t.Errorf("ann's answer names %q: %q", vendorLevel, body)
		}
	}
	if logs.find("admin action done", map[string]string{"action": "POST /api/dryrun", "operator": "spiffe://mesh.test/operator/ann", "status": "403"}) == nil {
		t.Error("ann's refused dry run is not logged with her identity")
	}
	if _, err := h.dryRun(context.Background(), viewer{tenant: "acme", comp: h.current().comp}, "spiffe://mesh.test/sink/acme-1", "", nil, &Config{}); !errors.Is(err, errVendorsCandidate) {
		t.Errorf("dryRun of a candidate for acme's operator: %v, want it refused whatever asks", err)
	}

	status, _, body = post(t, vera, dry, strings.NewReader(candidate))
	var d api.DryRun
	if status != http.StatusOK || json.Unmarshal([]byte(body), &d) != nil || !slices.Equal(d.NeedsRestart, []string{"serve", "limits"}) || d.Tenant != "acme" {
		t.Errorf("vera's dry run of the candidate: %d %s, want needsRestart [serve limits]", status, body)
	}

	code, body := call(t, ann, http.MethodGet, dry, nil)
	var now api.DryRun
	if code != http.StatusOK || json.Unmarshal([]byte(body), &now) != nil || now.Resources[vsColl]["shop/cart"] == "" || now.Candidate {
		t.Errorf("ann's dry run of her sink now: %d %s", code, body)
	}
}

// A candidate larger than api.MaxCandidateBytes is refused with 413 naming the bound,
// whether it says its length or not; one at the bound is evaluated. Before: anything up to
// 4 MiB was evaluated (and a larger one cut and refused as invalid YAML).
func TestDryRunCandidateSizeBound(t *testing.T) {
	h, _ := devHub(t, "127.0.0.1")
	_, _, httpAddr := h.Addrs()
	url := "http://" + httpAddr + "/api/dryrun?node=istiod-1"
	c := &http.Client{Timeout: 30 * time.Second}
	valid := "insecure: true\ningest: 127.0.0.1:0\nserve: 127.0.0.1:0\ncollections: [istio/networking/v1alpha3/virtualservices]\nclusters: [{name: east, identities: [east], namespaces: [shop], hosts: [\"*\"]}]\nrouting: {default: {name: all}}\n"
	padded := func(n int) string { // valid, n bytes long
		return valid + "#" + strings.Repeat("x", n-len(valid)-2) + "\n"
	}
	want := fmt.Sprintf("candidate configuration: larger than %d bytes (1 MiB), the most a dry run takes", 1<<20)
	for name, body := range map[string]io.Reader{
		"with its length":    strings.NewReader(padded(1<<20 + 1)),
		"without its length": io.MultiReader(strings.NewReader(padded(1<<20 + 1))), // sent chunked
	} {
		if status, _, msg := post(t, c, url, body); status != http.StatusRequestEntityTooLarge || !strings.Contains(msg, want) {
			t.Errorf("a candidate of 1 MiB + 1 byte, %s: %d %.200q, want 413 saying %q", name, status, msg, want)
		}
	}
	if status, _, msg := post(t, c, url, strings.NewReader(padded(1<<20))); status != http.StatusOK {
		t.Errorf("a candidate of 1 MiB: %d %.300s", status, msg)
	}
}

// Dry runs of candidates are evaluated one at a time: while one is (held here by a body
// that has not all arrived), another is refused at once with 429 and Retry-After, without
// its body being read; then the next is evaluated. Before: every one was evaluated, all at
// once (three clients in a loop put another cluster's change latency p99 at 3.2x).
func TestDryRunsOfCandidatesOneAtATime(t *testing.T) {
	h, logs := devHub(t, "127.0.0.1")
	_, _, httpAddr := h.Addrs()
	url := "http://" + httpAddr + "/api/dryrun?node=istiod-1"
	c := &http.Client{Timeout: 30 * time.Second}
	valid := "insecure: true\ningest: 127.0.0.1:0\nserve: 127.0.0.1:0\ncollections: [istio/networking/v1alpha3/virtualservices]\nclusters: [{name: east, identities: [east], namespaces: [shop], hosts: [\"*\"]}]\nrouting: {default: {name: all}}\n"

	pr, pw := io.Pipe()
	first := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url, pr)
		resp, err := c.Do(req)
		if err != nil {
			first <- 0
			return
		}
		resp.Body.Close()
		first <- resp.StatusCode
	}()
	if _, err := pw.Write([]byte(valid[:20])); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, 10*time.Second, "the first dry run to hold the hub's one slot", func() bool { return len(h.dryRuns) == 1 })

	status, retry, msg := post(t, c, url, strings.NewReader(valid))
	if status != http.StatusTooManyRequests || retry != "1" || !strings.Contains(msg, "another dry run of a candidate is being evaluated: the hub evaluates 1 at a time (each for up to 5s, then a pause as long); retry after 1s") {
		t.Errorf("a second dry run while one is evaluated: %d (Retry-After %q) %q, want 429, Retry-After 1", status, retry, msg)
	}
	if logs.find("admin action done", map[string]string{"action": "POST /api/dryrun", "status": "429"}) == nil {
		t.Error("the refused dry run is not logged")
	}

	if _, err := pw.Write([]byte(valid[20:])); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if got := <-first; got != http.StatusOK {
		t.Fatalf("the first dry run: %d", got)
	}
	testwait.For(t, 10*time.Second, "the slot to be free", func() bool { return len(h.dryRuns) == 0 })
	if status, _, msg := post(t, c, url, strings.NewReader(valid)); status != http.StatusOK {
		t.Errorf("the next dry run: %d %s", status, msg)
	}
}

// After a dry run of a candidate, the hub takes the next only once as long again has
// passed (its slot stays taken): clients looping dry runs get at most half of one CPU. One
// asking during that pause waits for its end and is answered (an operator's dry runs one
// after another go through). Before: the next was evaluated at once (and any number at a
// time).
func TestDryRunsOfCandidatesPause(t *testing.T) {
	h, logs := devHub(t, "127.0.0.1")
	_, _, httpAddr := h.Addrs()
	url := "http://" + httpAddr + "/api/dryrun?node=istiod-1"
	c := &http.Client{Timeout: 60 * time.Second}
	body := string(candidateYAML(120, 100)) // ~500 KB: ~150 ms to evaluate, a second or two under -race
	if status, _, msg := post(t, c, url, strings.NewReader(body)); status != http.StatusOK {
		t.Fatalf("the first dry run: %d %.300s", status, msg)
	}
	freeAt := time.Unix(0, h.dryRunFreeAt.Load())
	if len(h.dryRuns) != 1 || time.Until(freeAt) <= 0 {
		t.Fatalf("right after the first dry run's answer: slot taken %v, its pause ends in %v; want taken, for as long as the evaluation took", len(h.dryRuns) == 1, time.Until(freeAt))
	}
	if status, _, msg := post(t, c, url, strings.NewReader(body)); status != http.StatusOK || time.Now().Before(freeAt) {
		t.Errorf("a dry run asked during the pause: %d %.300s, answered %v before the pause's end; want 200 after it", status, msg, time.Until(freeAt))
	}
	if logs.find("admin action done", map[string]string{"action": "POST /api/dryrun", "status": "429"}) != nil {
		t.Error("a dry run asked during the pause was refused")
	}
}

// cpuSeconds is the CPU this process has used (every thread), in seconds.
func cpuSeconds(t *testing.T) float64 {
	t.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// A client that sends a large candidate and goes away leaves the hub idle: the dry run
// ends (its slot is released) and the hub's CPU goes back to nothing at once. Before: the
// hub went on compiling for as long as the candidate took (seconds of a core; minutes
// under the race detector), whether or not anyone would read the answer.
func TestDryRunStopsWhenItsClientGoes(t *testing.T) {
	h, _ := devHub(t, "127.0.0.1")
	_, _, httpAddr := h.Addrs()
	body := candidateYAML(240, 100) // just under 1 MiB
	ctx, cancel := context.WithCancel(context.Background())
	sent := make(chan struct{})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/api/dryrun?node=istiod-1", &signalReader{r: strings.NewReader(string(body)), eof: sent})
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = int64(len(body))
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	<-sent
	// The hub notices a client going away only once it has read the whole body (then the
	// server watches the connection): its arrival over loopback takes milliseconds, and
	// decoding and compiling it, hundreds of them (seconds under the race detector; before,
	// minutes), so this puts the cancel in the middle of the dry run.
	time.Sleep(300 * time.Millisecond)
	cancel()
	<-done
	testwait.For(t, 60*time.Second, "the dry run to end once its client has gone", func() bool { return len(h.dryRuns) == 0 })
	c0, w0 := cpuSeconds(t), time.Now()
	time.Sleep(500 * time.Millisecond) // measuring an interval: nothing to wait for
	if cores := (cpuSeconds(t) - c0) / time.Since(w0).Seconds(); cores > 0.3 {
		t.Errorf("after the client went away and the dry run ended, the process used %.2f cores: something goes on compiling", cores)
	}
}

// signalReader closes eof when r is exhausted.
type signalReader struct {
	r    io.Reader
	eof  chan struct{}
	once atomic.Bool
}

func (s *signalReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err == io.EOF && s.once.CompareAndSwap(false, true) {
		close(s.eof)
	}
	return n, err
}

// A dry run that takes longer than its bound is stopped and answered 503 naming it (the
// bound made tiny here: the candidate is small, and any dry run takes longer than 1 ns).
func TestDryRunTimeBound(t *testing.T) {
	h, _ := devHub(t, "127.0.0.1")
	h.dryRunTimeout.Store(int64(time.Nanosecond))
	_, _, httpAddr := h.Addrs()
	status, _, msg := post(t, &http.Client{Timeout: 30 * time.Second}, "http://"+httpAddr+"/api/dryrun?node=istiod-1", strings.NewReader(string(candidateYAML(2, 2))))
	// The body's read may itself miss a deadline of 1 ns (408); either way the bound is named.
	if (status != http.StatusServiceUnavailable || !strings.Contains(msg, "the dry run was stopped after 1ns, the most one may take")) &&
		(status != http.StatusRequestTimeout || !strings.Contains(msg, "not received within 1ns")) {
		t.Errorf("a dry run over its time bound: %d %q, want 503 (or 408) naming the bound", status, msg)
	}
}

// countingCtx is a context whose Err says Canceled from its (after+1)th call on: a loop
// that asks it stops there.
type countingCtx struct {
	context.Context
	calls, after atomic.Int64
}

func (c *countingCtx) Err() error {
	if c.calls.Add(1) > c.after.Load() {
		return context.Canceled
	}
	return nil
}

// Compiling a configuration asks its context throughout (every cluster, tenant, and 1,024th
// pattern of the overlap checks), and stops at the first answer that it has ended, however
// far it got: a dry run stops when its request does. So does the store's walk of what a
// sink is served.
func TestCompileObservesItsContext(t *testing.T) {
	cfg, err := decodeConfig(candidateYAML(60, 100))
	if err != nil {
		t.Fatal(err)
	}
	full := &countingCtx{Context: context.Background()}
	full.after.Store(math.MaxInt64)
	if _, err := cfg.compileCtx(full); err != nil {
		t.Fatal(err)
	}
	asked := full.calls.Load()
	if asked < 60 {
		t.Fatalf("compiling 60 clusters of 100 patterns asked its context %d times", asked)
	}
	for _, after := range []int64{0, 1, asked / 3, asked / 2, asked - 1} {
		c := &countingCtx{Context: context.Background()}
		c.after.Store(after)
		if _, err := cfg.compileCtx(c); !errors.Is(err, context.Canceled) || c.calls.Load() != after+1 {
			t.Errorf("cancelled at the %dth of %d questions: %v after %d questions, want Canceled at once", after+1, asked, err, c.calls.Load())
		}
	}

	h := testHub(t, twoClusters)
	var names []string
	for i := range 3000 {
		names = append(names, fmt.Sprintf("shop/vs-%d", i))
	}
	if err := h.Apply("east", vsPush(t, names...)); err != nil {
		t.Fatal(err)
	}
	rt := h.current().comp.routeOf("", "global-a", nil)
	c := &countingCtx{Context: context.Background()}
	c.after.Store(1)
	if _, err := h.store.servedWith(c, rt, nil); !errors.Is(err, context.Canceled) || c.calls.Load() != 2 {
		t.Errorf("the store's walk cancelled at its 2nd question: %v after %d", err, c.calls.Load())
	}
}

// A candidate at the size bound compiles well within the time bound (under the race
// detector too): the overlap checks are no longer quadratic. Before: the pairwise checks
// took ~3 s for this candidate (minutes under the race detector).
func TestCandidateAtTheSizeBoundCompilesInTime(t *testing.T) {
	body := candidateYAML(240, 100)
	if len(body) > api.MaxCandidateBytes {
		t.Fatalf("the candidate is %d bytes, over the bound", len(body))
	}
	cfg, err := decodeConfig(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), dryRunTimeout)
	defer cancel()
	if _, err := cfg.compileCtx(ctx); err != nil {
		t.Errorf("a %d-byte candidate: %v", len(body), err)
	}
}

// BenchmarkCompileCandidate: decoding and compiling candidates of growing size (clusters of
// 100 namespace and 100 host patterns), as a dry run does.
func BenchmarkCompileCandidate(b *testing.B) {
	for _, clusters := range []int{30, 60, 120, 240} {
		body := candidateYAML(clusters, 100)
		b.Run(fmt.Sprintf("clusters=%d/bytes=%d", clusters, len(body)), func(b *testing.B) {
			for b.Loop() {
				cfg, err := decodeConfig(body)
				if err != nil {
					b.Fatal(err)
				}
				if _, err := cfg.compileCtx(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
