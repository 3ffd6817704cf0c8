package hub

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/meshfed/meshfed/hub/api"
	"github.com/meshfed/meshfed/internal/testkit/promtest"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testrun"
	"github.com/meshfed/meshfed/internal/testkit/testwait"
	meshtls "github.com/meshfed/meshfed/tls"
	"github.com/meshfed/meshfed/tls/tlstest"
)

// Operators' actions on hubs that run: real listeners on loopback, real mutual TLS from a
// test CA, real HTTP.

// logBuffer keeps a hub's JSON log lines for the test to look for (and passes them to the
// test's log).
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// find returns the first log entry with message msg whose attributes include want.
func (b *logBuffer) find(msg string, want map[string]string) map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	sc := bufio.NewScanner(bytes.NewReader(b.buf.Bytes()))
	sc.Buffer(nil, 1<<20)
next:
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) != nil || e["msg"] != msg {
			continue
		}
		for k, v := range want {
			if fmt.Sprint(e[k]) != v {
				continue next
			}
		}
		return e
	}
	return nil
}

// runHub runs a hub of yaml until the test ends, once its listeners are open.
func runHub(t *testing.T, yaml string) (*Hub, *logBuffer) {
	t.Helper()
	cfg, err := ParseConfig([]byte(yaml))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.StateDir == Defaults().StateDir {
		cfg.StateDir = t.TempDir()
	}
	logs := &logBuffer{}
	h, err := New(cfg, slog.New(slog.NewJSONHandler(io.MultiWriter(logs, testlog.Writer(t, "hub: ")), nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	testrun.Start(t, "hub", h.Run)
	testwait.For(t, 10*time.Second, "the hub's listeners", func() bool {
		_, _, httpAddr := h.Addrs()
		return httpAddr != "" && (cfg.AdminTLS == "" || h.AdminTLSAddr() != "")
	})
	return h, logs
}

// tripBreaker makes cluster's breaker hold the deletion of 12 VirtualServices in shop.
func tripBreaker(t *testing.T, h *Hub, cluster string) {
	t.Helper()
	var names []string
	for i := range 12 {
		names = append(names, fmt.Sprintf("shop/vs-%d", i))
	}
	if err := h.Apply(cluster, vsPush(t, names...)); err != nil {
		t.Fatal(err)
	}
	_ = h.Apply(cluster, vsPush(t)) // every one deleted: held (the error is the NACK saying so)
	for _, cl := range h.Clusters() {
		if cl.Name == cluster && (cl.Breaker == nil || !cl.Breaker.Open || cl.Breaker.Held != 12) {
			t.Fatalf("cluster %s's breaker after deleting everything: %+v, want open holding 12", cluster, cl.Breaker)
		}
	}
}

// call sends method url with c and returns the status and the body.
func call(t *testing.T, c *http.Client, method, url string, header http.Header) (int, string) {
	t.Helper()
	return callBody(t, c, method, url, header, "")
}

// callBody is call with a request body.
func callBody(t *testing.T, c *http.Client, method, url string, header http.Header, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// tlsClient is an HTTPS client presenting files' certificate (none if Cert is empty) and
// trusting files' bundle.
func tlsClient(t *testing.T, files meshtls.Files) *http.Client {
	t.Helper()
	var conf *tls.Config
	if files.Cert == "" {
		pem, err := os.ReadFile(files.CA)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		conf = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	} else {
		src, err := meshtls.NewSource(files, testlog.New(t))
		if err != nil {
			t.Fatal(err)
		}
		conf = src.ClientConfig("")
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: conf}, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// Over adminTLS, an operator's certificate releases a breaker (the release names it, and
// the log says who and from where); a sink's, a cluster's, another trust domain's operator
// and a browser's cross-origin request are refused with 403, plain http with 401 (and
// each refusal is logged with who asked); a client without a certificate, or with another
// CA's, does not get past the handshake. Reading needs no operator: anyone on http, any
// verified certificate on adminTLS.
func TestOperatorActionsOverAdminTLS(t *testing.T) {
	p := newPKI(t)
	files, bundle := p.files, p.bundle
	hubFiles := meshtls.Files{Cert: p.hubCert, Key: p.hubKy}
	h, logs := runHub(t, `
tls: {certFile: `+hubFiles.Cert+`, keyFile: `+hubFiles.Key+`, caFile: `+bundle+`}
trustDomain: mesh.test
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
adminTLS: 127.0.0.1:0
collections: [istio/networking/v1alpha3/virtualservices]
clusters: [{name: east, namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`)
	_, _, httpAddr := h.Addrs()
	admin := "https://" + h.AdminTLSAddr()
	release := "/api/clusters/east/breaker/release"
	tripBreaker(t, h, "east")

	alice := tlsClient(t, files("alice", "spiffe://mesh.test/operator/alice"))
	refused := []struct {
		name, id string
		client   *http.Client
		url      string
		header   http.Header
		status   int
		says     string
	}{
		{"a sink's certificate", "spiffe://mesh.test/sink/istiod-1", tlsClient(t, files("sink", "spiffe://mesh.test/sink/istiod-1")), admin + release, nil,
			http.StatusForbidden, `identity "spiffe://mesh.test/sink/istiod-1" is not an operator: actions need a client certificate for spiffe://mesh.test/operator/NAME`},
		{"a cluster's certificate", "spiffe://mesh.test/cluster/east", tlsClient(t, files("east", "spiffe://mesh.test/cluster/east")), admin + release, nil,
			http.StatusForbidden, "is not an operator"},
		{"another trust domain's operator", "spiffe://other.test/operator/alice", tlsClient(t, files("other", "spiffe://other.test/operator/alice")), admin + release, nil,
			http.StatusForbidden, "is not an operator"},
		{"an operator's browser, cross-origin", "spiffe://mesh.test/operator/alice", alice, admin + release, http.Header{"Sec-Fetch-Site": {"cross-site"}},
			http.StatusForbidden, "a browser's cross-origin request cannot act on the hub"},
		{"plain http", "none (the http listener carries no certificate)", &http.Client{Timeout: 10 * time.Second}, "http://" + httpAddr + release, nil,
			http.StatusUnauthorized, "actions need an authenticated operator: a client certificate for spiffe://mesh.test/operator/NAME, over adminTLS (" + h.AdminTLSAddr() + "), not the http listener"},
	}
	for _, tc := range refused {
		status, body := call(t, tc.client, http.MethodPost, tc.url, tc.header)
		if status != tc.status || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %q, want %d saying %q", tc.name, status, body, tc.status, tc.says)
		}
		e := logs.find("admin action refused", map[string]string{"identity": tc.id, "action": "POST " + release, "status": fmt.Sprint(tc.status)})
		if e == nil || !strings.HasPrefix(fmt.Sprint(e["peer"]), "127.0.0.1:") || !strings.Contains(fmt.Sprint(e["reason"]), tc.says) {
			t.Errorf("%s: refusal logged as %v, want identity %s, peer and reason", tc.name, e, tc.id)
		}
	}
	if cl := h.Clusters(); cl[0].Breaker == nil || cl[0].Breaker.Held != 12 {
		t.Fatalf("a refused request changed the breaker: %+v", cl[0].Breaker)
	}

	// No certificate, or one of another CA: the handshake fails, and the log says why and
	// from where.
	other := tlstest.NewCA(t, "other")
	ocert, okey, _ := other.Issue(t, p.dir, "mallory", "spiffe://mesh.test/operator/mallory")
	for name, c := range map[string]*http.Client{
		"no certificate":        tlsClient(t, meshtls.Files{CA: bundle}),
		"another CA's operator": tlsClient(t, meshtls.Files{Cert: ocert, Key: okey, CA: bundle}),
	} {
		req, _ := http.NewRequest(http.MethodPost, admin+release, nil)
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
			t.Errorf("%s: answered %s, want the handshake refused", name, resp.Status)
		}
	}
	for _, reason := range []string{meshtls.RejectNoCertificate, meshtls.RejectUnknownAuthority} {
		testwait.For(t, 5*time.Second, "the refused handshake ("+reason+") counted and logged with the peer", func() bool {
			e := logs.find("TLS handshake refused", map[string]string{"reason": reason})
			// The peer is a net.Addr: the JSON handler writes its fields, not its String.
			return e != nil && strings.Contains(fmt.Sprint(e["peer"]), "127.0.0.1") &&
				promtest.Sum(t, h.Registry(), "meshfed_hub_tls_rejections_total", map[string]string{"reason": reason}) == 1
		})
	}

	// Reading: anyone on http, any verified certificate on adminTLS; GET never acts.
	sink := tlsClient(t, files("reader", "spiffe://mesh.test/sink/reader"))
	for url, c := range map[string]*http.Client{"http://" + httpAddr + "/api/clusters": {Timeout: 10 * time.Second}, admin + "/api/clusters": sink, "http://" + httpAddr + "/healthz": {Timeout: 10 * time.Second}} {
		if status, body := call(t, c, http.MethodGet, url, nil); status != http.StatusOK {
			t.Errorf("GET %s: %d %s", url, status, body)
		}
	}
	if status, _ := call(t, alice, http.MethodGet, admin+release, nil); status != http.StatusMethodNotAllowed {
		t.Errorf("GET of an action: %d, want 405", status)
	}

	// The operator: without naming what it reviewed, or naming another set, refused;
	// released with the breaker's digest, named in the answer and the log; then nothing is
	// held.
	if status, body := call(t, alice, http.MethodPost, admin+release, nil); status != http.StatusConflict || !strings.Contains(body, "name the held deletions you reviewed") {
		t.Errorf("a release naming no digest: %d %s", status, body)
	}
	if status, body := callBody(t, alice, http.MethodPost, admin+release, nil, `{"digest": "0011223344556677"}`); status != http.StatusConflict ||
		!strings.Contains(body, "the held deletions changed since they were reviewed (digest 0011223344556677 then") {
		t.Errorf("a release naming another digest: %d %s", status, body)
	}
	status, body := callBody(t, alice, http.MethodPost, admin+release, nil, reviewed(t, h, "east"))
	var rel api.BreakerRelease
	if status != http.StatusOK || json.Unmarshal([]byte(body), &rel) != nil || rel.Cluster != "east" || rel.Operator != "spiffe://mesh.test/operator/alice" ||
		rel.Deleted[vsColl] != 12 {
		t.Fatalf("release by the operator: %d %s", status, body)
	}
	if e := logs.find("admin action by an operator", map[string]string{"operator": "spiffe://mesh.test/operator/alice", "action": "POST " + release}); e == nil ||
		!strings.HasPrefix(fmt.Sprint(e["peer"]), "127.0.0.1:") {
		t.Errorf("accepted action logged as %v", e)
	}
	if cl := h.Clusters(); cl[0].Breaker != nil || cl[0].Resources[vsColl] != 0 {
		t.Errorf("after the release: breaker %+v, %d resources", cl[0].Breaker, cl[0].Resources[vsColl])
	}
	for url, want := range map[string]int{admin + release: http.StatusConflict, admin + "/api/clusters/north/breaker/release": http.StatusNotFound} {
		if status, body := call(t, alice, http.MethodPost, url, nil); status != want {
			t.Errorf("POST %s: %d %s, want %d", url, status, body, want)
		}
	}
	if logs.find("admin action done", map[string]string{"operator": "spiffe://mesh.test/operator/alice", "status": "409"}) == nil {
		t.Error("an action's outcome (409) is not logged")
	}
}

// An operator is its certificate's one URI SAN, spelled exactly spiffe://<td>/operator/NAME
// (issue 25, finding 9). A common name that looks like an operator's ID, and a URI SAN
// that a URI parser would read as another path, or as alice's ID with a percent-encoded
// byte or an empty fragment, are no operator: 403, saying why, and the breaker still holds.
func TestOperatorIsACanonicalSPIFFEID(t *testing.T) {
	p := newPKI(t)
	h, logs := runHub(t, `
tls: {certFile: `+p.hubCert+`, keyFile: `+p.hubKy+`, caFile: `+p.bundle+`}
trustDomain: mesh.test
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: 127.0.0.1:0
adminTLS: 127.0.0.1:0
collections: [istio/networking/v1alpha3/virtualservices]
clusters: [{name: east, namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`)
	release := "https://" + h.AdminTLSAddr() + "/api/clusters/east/breaker/release"
	tripBreaker(t, h, "east")
	client := func(cert, key string, _ int64) *http.Client {
		return tlsClient(t, meshtls.Files{Cert: cert, Key: key, CA: p.bundle})
	}
	for _, tc := range []struct {
		name   string
		client *http.Client
		says   string
	}{
		{"a common name, no URI SAN", client(p.ca.IssueCN(t, p.dir, "mallory", "spiffe://mesh.test/operator/mallory")), `its common name "spiffe://mesh.test/operator/mallory" looks like a SPIFFE ID`},
		{"a path through ..", client(p.ca.Issue(t, p.dir, "dots", "spiffe://mesh.test/operator/alice/../../cluster/west")),
			`identity "spiffe://mesh.test/operator/alice/../../cluster/west" is not an operator (not a SPIFFE ID of this hub: its path "/operator/alice/../../cluster/west" is not /KIND/NAME`},
		{"a trailing slash", client(p.ca.Issue(t, p.dir, "slash", "spiffe://mesh.test/operator/alice/")), "is not /KIND/NAME"},
		{"percent-encoding", client(p.ca.IssueRawURI(t, p.dir, "pct", "spiffe://mesh.test/operator/%61lice")), `has "%"`},
		{"an empty fragment", client(p.ca.IssueRawURI(t, p.dir, "frag", "spiffe://mesh.test/operator/alice#")), `has "#"`},
		{"the scheme in upper case", client(p.ca.IssueRawURI(t, p.dir, "upper", "SPIFFE://mesh.test/operator/alice")), "does not begin with spiffe://"},
	} {
		status, body := call(t, tc.client, http.MethodPost, release, nil)
		if status != http.StatusForbidden || !strings.Contains(body, tc.says) {
			t.Errorf("%s: %d %q, want 403 saying %q", tc.name, status, body, tc.says)
		}
		if e := logs.find("admin action refused", map[string]string{"status": "403", "reason": strings.TrimSpace(body)}); e == nil {
			t.Errorf("%s: the refusal is not logged", tc.name)
		}
	}
	if cl := h.Clusters(); cl[0].Breaker == nil || cl[0].Breaker.Held != 12 {
		t.Fatalf("a refused request changed the breaker: %+v", cl[0].Breaker)
	}
}

// devHub is a hub in development mode (insecure) with http on host:0.
func devHub(t *testing.T, host string) (*Hub, *logBuffer) {
	t.Helper()
	return runHub(t, `
insecure: true
ingest: 127.0.0.1:0
serve: 127.0.0.1:0
http: `+net.JoinHostPort(host, "0")+`
collections: [istio/networking/v1alpha3/virtualservices]
clusters: [{name: east, identities: [east], namespaces: [shop], hosts: ["*"]}]
routing: {default: {name: all}}
`)
}

// In development mode (insecure) nobody is authenticated: actions are taken on http from
// a loopback peer, addressed to loopback, recorded as DevOperator; a request addressed to
// another name (a page that had its name resolve to 127.0.0.1) is refused.
func TestOperatorActionsInDevelopmentMode(t *testing.T) {
	h, logs := devHub(t, "127.0.0.1")
	_, _, httpAddr := h.Addrs()
	release := "http://" + httpAddr + "/api/clusters/east/breaker/release"
	c := &http.Client{Timeout: 10 * time.Second}
	tripBreaker(t, h, "east")

	req, _ := http.NewRequest(http.MethodPost, release, nil)
	req.Host = "rebound.example:80"
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(b), `development mode (insecure) takes actions addressed to a loopback address only (127.0.0.1, ::1, localhost), not "rebound.example:80"`) {
		t.Errorf("addressed to another name: %s %s", resp.Status, b)
	}

	status, body := callBody(t, c, http.MethodPost, release, nil, reviewed(t, h, "east"))
	var rel api.BreakerRelease
	if status != http.StatusOK || json.Unmarshal([]byte(body), &rel) != nil || rel.Operator != DevOperator || rel.Deleted[vsColl] != 12 {
		t.Fatalf("release from loopback: %d %s", status, body)
	}
	if e := logs.find("admin action by an operator", map[string]string{"operator": DevOperator}); e == nil || !strings.HasPrefix(fmt.Sprint(e["peer"]), "127.0.0.1:") {
		t.Errorf("accepted action logged as %v", e)
	}
}

// In development mode a peer that is not loopback is refused, and the log names it. The
// machine's first non-loopback address is the peer (skipped on a machine without one).
func TestOperatorActionsInDevelopmentModeNotFromElsewhere(t *testing.T) {
	var ip string
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			ip = n.IP.String()
			break
		}
	}
	if ip == "" {
		t.Skip("this machine has no non-loopback IPv4 address to be a peer from")
	}
	h, logs := devHub(t, ip)
	_, _, httpAddr := h.Addrs()
	status, body := call(t, &http.Client{Timeout: 10 * time.Second}, http.MethodPost, "http://"+httpAddr+"/api/clusters/east/breaker/release", nil)
	if status != http.StatusForbidden || !strings.Contains(body, "development mode (insecure) authenticates nobody, so it takes actions from a loopback peer only; "+ip+":") {
		t.Errorf("from %s: %d %s", ip, status, body)
	}
	if e := logs.find("admin action refused", map[string]string{"identity": "none (development mode)", "status": "403"}); e == nil || !strings.HasPrefix(fmt.Sprint(e["peer"]), ip+":") {
		t.Errorf("refusal logged as %v, want the peer %s", e, ip)
	}
	if status, _ := call(t, &http.Client{Timeout: 10 * time.Second}, http.MethodGet, "http://"+httpAddr+"/api/clusters", nil); status != http.StatusOK {
		t.Errorf("reading from %s: %d", ip, status)
	}
}

// adminTLS is a mutual TLS listener in a trust domain, fixed at start; an action's pattern
// is a POST.
func TestAdminTLSConfigAndActionPattern(t *testing.T) {
	base := "clusters: [{name: a, namespaces: [x]}]\n"
	for _, tc := range []struct{ yaml, want string }{
		{base + "insecure: true\nadminTLS: 127.0.0.1:1", "adminTLS: needs tls or devCA"},
		{base + "tls: {certFile: c, keyFile: k, caFile: ca}\nadminTLS: 127.0.0.1:1", "adminTLS: needs trustDomain (an operator is spiffe://<trustDomain>/operator/NAME)"},
		{base + "devCA: true\nadminTLS: nowhere", "adminTLS: address nowhere: missing port"},
	} {
		if _, err := ParseConfig([]byte(tc.yaml)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.yaml, err, tc.want)
		}
	}
	if _, err := ParseConfig([]byte(base + "devCA: true\nadminTLS: 127.0.0.1:1")); err != nil {
		t.Errorf("devCA (trust domain %s) with adminTLS: %v", DevTrustDomain, err)
	}
	if cfg := DefaultConfig(); cfg.AdminTLS == "" || cfg.Validate() != nil {
		t.Errorf("DefaultConfig has no adminTLS, or it does not validate: %q", cfg.AdminTLS)
	}
	h := testHub(t, base+"devCA: true\nstateDir: "+t.TempDir()+"\nadminTLS: 127.0.0.1:1\n")
	next, err := ParseConfig([]byte(base + "devCA: true\nstateDir: " + h.cfg.StateDir + "\nadminTLS: 127.0.0.1:2\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Reload(next); err == nil || !strings.Contains(err.Error(), "adminTLS: changing it needs a restart") {
		t.Errorf("reload changing adminTLS: %v", err)
	}
	defer func() {
		if p := recover(); p == nil || !strings.Contains(fmt.Sprint(p), "an action's pattern is POST /path") {
			t.Errorf("an action registered for GET: %v", p)
		}
	}()
	h.action(http.NewServeMux(), "/api/clusters/{name}/breaker/release", nil)
}

// reviewed is a release's body naming what cluster's breaker holds now.
func reviewed(t *testing.T, h *Hub, cluster string) string {
	t.Helper()
	for _, c := range h.Clusters() {
		if c.Name == cluster && c.Breaker != nil {
			return `{"digest": "` + c.Breaker.Digest + `"}`
		}
	}
	t.Fatalf("cluster %s's breaker holds nothing", cluster)
	return ""
}
