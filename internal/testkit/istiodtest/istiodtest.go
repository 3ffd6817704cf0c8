// Package istiodtest runs a real istiod — pilot-discovery, built from the pinned module
// test/istiod/pilot by package testbin — on 127.0.0.1 for tests, with its Istio configuration
// coming from one config source (typically a hub's MCP-over-xDS address), and reads back
// what it holds and how often its stream to that source closed.
//
// istiod needs a kube-apiserver for its service registry even when all Istio config comes
// from configSources: Options.Kubeconfig points it at one (package kubetest runs one; an
// admin kubeconfig is enough). Start creates the namespace istio-system there. The
// environment turns off istiod's CA, certificates, injection and validation webhooks, so
// it runs without any of them.
//
// No port is fixed or guessed: istiod listens for HTTP and gRPC on 127.0.0.1:0 and the
// bound addresses are read from its log; its monitoring endpoints (/metrics, /debug/...)
// are served on the HTTP address (monitoringAddr is empty), and ControlZ on a port of its
// own choosing. Every process is SIGKILLed and awaited by the test's cleanup, and its
// output goes to the test's log.
//
// It is test infrastructure: nothing in the product imports it.
package istiodtest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testlog"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
)

// Namespace is istiod's own namespace (POD_NAMESPACE) and the mesh's root namespace.
const Namespace = "istio-system"

// TLSSettings make istiod dial its config source with TLS (mode SIMPLE: it verifies the
// server; istiod has no client certificate option for a config source).
type TLSSettings struct {
	// CACertFile is the PEM file of the CAs istiod trusts for the config source.
	CACertFile string
	// SubjectAltNames, if any, are the SANs istiod accepts in the server's certificate.
	SubjectAltNames []string
	// SNI is the server name istiod sends, if set.
	SNI string
}

// Options say what istiod runs against.
type Options struct {
	// Kubeconfig is the kubeconfig file of the kube-apiserver istiod uses (required).
	Kubeconfig string
	// ConfigSource is the address of its only config source, e.g. "xds://127.0.0.1:9900"
	// (required).
	ConfigSource string
	// TLS, when set, makes istiod dial ConfigSource with TLS; nil: plaintext.
	TLS *TLSSettings
	// Dir holds mesh.yaml and networks.yaml; default t.TempDir().
	Dir string
	// Env is added to (and overrides) the environment Start sets, as "KEY=value".
	Env []string
	// Args are added after the flags Start passes.
	Args []string
}

// Istiod is a running (or killed) pilot-discovery.
type Istiod struct {
	// Dir holds mesh.yaml and networks.yaml.
	Dir string
	// MeshConfig is the path of mesh.yaml.
	MeshConfig string

	t    testing.TB
	bin  string
	args []string
	env  []string

	mu   sync.Mutex // guards r and runs
	r    *run
	runs int
}

// run is one pilot-discovery process, with what it has logged: the addresses it bound and
// how often its stream to the config source closed.
type run struct {
	p *testproc.Proc

	mu     sync.Mutex // guards addrs and closed
	addrs  map[*regexp.Regexp]string
	closed int
}

// tailLines is how many of istiod's last lines of output Output and failure messages show.
const tailLines = 60

// Start writes istiod's mesh configuration into o.Dir, makes sure namespace istio-system
// exists, and starts pilot-discovery. It does not wait for istiod: Ready and WaitReady say
// when it serves, Exited and Output when it gave up (istiod exits at start when its config
// source refuses it).
func Start(t testing.TB, o Options) *Istiod {
	t.Helper()
	if o.Kubeconfig == "" || o.ConfigSource == "" {
		t.Fatal("istiodtest: Options.Kubeconfig and Options.ConfigSource are required")
	}
	bin := testbin.Require(t, "pilot-discovery")
	if o.Dir == "" {
		o.Dir = t.TempDir()
	}
	i := &Istiod{Dir: o.Dir, MeshConfig: filepath.Join(o.Dir, "mesh.yaml"), t: t, bin: bin}
	mesh, err := MeshConfig(o.ConfigSource, o.TLS)
	if err != nil {
		t.Fatal(err)
	}
	networks := filepath.Join(o.Dir, "networks.yaml")
	for path, content := range map[string]string{i.MeshConfig: mesh, networks: "networks: {}\n"} {
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ensureNamespace(t, o.Kubeconfig)
	i.args = append([]string{
		"discovery",
		"--kubeconfig=" + o.Kubeconfig,
		"--meshConfig=" + i.MeshConfig,
		"--networksConfig=" + networks,
		"--httpAddr=127.0.0.1:0",
		"--grpcAddr=127.0.0.1:0",
		"--secureGRPCAddr=",
		"--httpsAddr=",
		"--monitoringAddr=", // served on httpAddr
		"--ctrlz_address=127.0.0.1",
		"--ctrlz_port=0",
		"--domain=cluster.local",
	}, o.Args...)
	i.env = append(append(os.Environ(),
		"POD_NAMESPACE="+Namespace,
		"POD_NAME=istiod-test",
		"REVISION=default",
		"ENABLE_CA_SERVER=false",
		"PILOT_CERT_PROVIDER=none",
		"INJECT_ENABLED=false",
		"VALIDATION_WEBHOOK_CONFIG_NAME=",
		"PILOT_ENABLE_IP_AUTOALLOCATE=false",
	), o.Env...)
	i.start()
	return i
}

// MeshConfig returns the mesh.yaml Start writes: one config source at address (with
// tlsSettings mode SIMPLE when tls is set), ingress controller off, root namespace
// istio-system.
func MeshConfig(address string, tls *TLSSettings) (string, error) {
	src := map[string]any{"address": address}
	if tls != nil {
		// istiod takes the PEM itself here, not a path (pilot/pkg/bootstrap
		// configcontroller.go appends tlsSettings.caCertificates to a pool as it is).
		pem, err := os.ReadFile(tls.CACertFile)
		if err != nil {
			return "", err
		}
		ts := map[string]any{"mode": "SIMPLE", "caCertificates": string(pem)}
		if len(tls.SubjectAltNames) > 0 {
			ts["subjectAltNames"] = tls.SubjectAltNames
		}
		if tls.SNI != "" {
			ts["sni"] = tls.SNI
		}
		src["tlsSettings"] = ts
	}
	b, err := yaml.Marshal(map[string]any{
		"configSources":         []any{src},
		"ingressControllerMode": "OFF",
		"rootNamespace":         Namespace,
	})
	return string(b), err
}

// ensureNamespace creates istio-system unless it exists: istiod's leader elections keep
// their leases there.
func ensureNamespace(t testing.TB, kubeconfig string) {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatalf("istiodtest: kubeconfig %s: %v", kubeconfig, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("istiodtest: create namespace %s: %v", Namespace, err)
	}
}

var (
	httpRE = regexp.MustCompile(`starting HTTP service at (\S+)`)
	grpcRE = regexp.MustCompile(`starting gRPC discovery service at (\S+)`)
)

// sourceClosed is what istiod's config-source client (pkg/adsc) logs when its stream ends;
// it redials after.
const sourceClosed = "connection closed with err"

// start starts pilot-discovery; its output goes to the test's log, prefixed "istiod: "
// ("istiod#2: " after a restart), and is read by run.read.
func (i *Istiod) start() {
	i.t.Helper()
	i.mu.Lock()
	defer i.mu.Unlock()
	i.runs++
	prefix := "istiod: "
	if i.runs > 1 {
		prefix = fmt.Sprintf("istiod#%d: ", i.runs)
	}
	r := &run{addrs: map[*regexp.Regexp]string{}}
	r.p = testproc.Start(i.t, testproc.Options{Path: i.bin, Args: i.args, Env: i.env, Log: testlog.Writer(i.t, prefix), OnLine: r.read})
	i.r = r
}

// read remembers the first address each of httpRE and grpcRE finds in istiod's output, and
// counts the closes of its config-source stream.
func (r *run) read(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if strings.Contains(line, sourceClosed) {
		r.closed++
	}
	for _, re := range []*regexp.Regexp{httpRE, grpcRE} {
		if m := re.FindStringSubmatch(line); m != nil && r.addrs[re] == "" {
			r.addrs[re] = m[1]
		}
	}
}

func (r *run) addr(re *regexp.Regexp) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addrs[re]
}

// current returns the current run.
func (i *Istiod) current() *run {
	i.mu.Lock()
	defer i.mu.Unlock()
	return i.r
}

// HTTPAddr is the address istiod serves HTTP on (/ready, /debug/..., /metrics), or ""
// until it has logged it.
func (i *Istiod) HTTPAddr() string { return i.current().addr(httpRE) }

// GRPCAddr is the address of istiod's plaintext xDS server, or "" until it listens (after
// its caches, the config source's included, have synced).
func (i *Istiod) GRPCAddr() string { return i.current().addr(grpcRE) }

// SourceStreamsClosed is how many times the current istiod process has logged that its
// stream to the config source closed (it redials after): a test that stops the source waits
// for it to know that istiod has seen it go, rather than sleeping.
func (i *Istiod) SourceStreamsClosed() int {
	r := i.current()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Ready reports whether GET /ready answers 200: istiod's config source has answered every
// type it asked for and its caches have synced.
func (i *Istiod) Ready() bool {
	addr := i.HTTPAddr()
	if addr == "" {
		return false
	}
	resp, err := httpClient.Get("http://" + addr + "/ready")
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// WaitReady waits until Ready, failing t if istiod exits first or timeout passes.
func (i *Istiod) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !i.Ready() {
		p := i.current().p
		if p.Exited() {
			t.Fatalf("istiod exited before it was ready:\n%s", p.Tail(tailLines))
		}
		if time.Now().After(deadline) {
			t.Fatalf("istiod not ready after %v (http %q)\n%s", timeout, i.HTTPAddr(), p.Tail(tailLines))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Exited reports whether the current istiod process has ended.
func (i *Istiod) Exited() bool { return i.current().p.Exited() }

// Output returns the last lines istiod wrote (stdout and stderr).
func (i *Istiod) Output() string { return i.current().p.Tail(tailLines) }

// Kill kills istiod with SIGKILL and waits for it to end. Killing it twice is harmless.
func (i *Istiod) Kill() { i.current().p.Kill() }

// Restart kills istiod (SIGKILL) and starts it again with the same configuration. It
// listens on new ports: ask HTTPAddr and GRPCAddr again.
func (i *Istiod) Restart() {
	i.t.Helper()
	i.Kill()
	i.start()
}

// Object is one config object istiod holds, as GET /debug/configz renders it (Istio's
// Kubernetes form of a config.Config).
type Object struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	Metadata   struct {
		Name            string            `json:"name"`
		Namespace       string            `json:"namespace,omitempty"`
		ResourceVersion string            `json:"resourceVersion,omitempty"`
		Labels          map[string]string `json:"labels,omitempty"`
		Annotations     map[string]string `json:"annotations,omitempty"`
	} `json:"metadata"`
	Spec json.RawMessage `json:"spec,omitempty"`
}

// Type is the object's group and kind, "networking.istio.io/VirtualService" (the version
// left out: istiod lists each kind under its one stored version).
func (o Object) Type() string {
	group := o.APIVersion
	if j := strings.LastIndexByte(group, '/'); j >= 0 {
		group = group[:j]
	} else {
		group = "" // core ("v1")
	}
	return group + "/" + o.Kind
}

// Key is "namespace/name", or the name of a cluster-scoped object.
func (o Object) Key() string {
	if o.Metadata.Namespace == "" {
		return o.Metadata.Name
	}
	return o.Metadata.Namespace + "/" + o.Metadata.Name
}

// Configz is what istiod holds, every config store together.
type Configz []Object

// Objects returns type -> key -> resourceVersion (see Object.Type and Object.Key). A
// resource from an MCP-over-xDS source has the version the source sent as its
// resourceVersion.
func (c Configz) Objects() map[string]map[string]string {
	out := map[string]map[string]string{}
	for _, o := range c {
		m := out[o.Type()]
		if m == nil {
			m = map[string]string{}
			out[o.Type()] = m
		}
		m[o.Key()] = o.Metadata.ResourceVersion
	}
	return out
}

// Get returns the object of type typ ("networking.istio.io/VirtualService") and key
// ("shop/cart").
func (c Configz) Get(typ, key string) (Object, bool) {
	for _, o := range c {
		if o.Type() == typ && o.Key() == key {
			return o, true
		}
	}
	return Object{}, false
}

// Keys returns the sorted keys of the objects of type typ.
func (c Configz) Keys(typ string) []string {
	var out []string
	for _, o := range c {
		if o.Type() == typ {
			out = append(out, o.Key())
		}
	}
	sort.Strings(out)
	return out
}

// Configz fetches GET /debug/configz, failing t if it cannot.
func (i *Istiod) Configz(t testing.TB) Configz {
	t.Helper()
	c, err := i.FetchConfigz()
	if err != nil {
		t.Fatalf("istiod configz: %v", err)
	}
	return c
}

// FetchConfigz fetches GET /debug/configz (for polling from a condition).
func (i *Istiod) FetchConfigz() (Configz, error) {
	addr := i.HTTPAddr()
	if addr == "" {
		return nil, fmt.Errorf("istiod has no HTTP address yet")
	}
	resp, err := httpClient.Get("http://" + addr + "/debug/configz")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /debug/configz: %d %s", resp.StatusCode, body)
	}
	var c Configz
	if err := json.Unmarshal(body, &c); err != nil {
		return nil, fmt.Errorf("GET /debug/configz: %v", err)
	}
	return c, nil
}

// Objects is Configz(t).Objects().
func (i *Istiod) Objects(t testing.TB) map[string]map[string]string {
	t.Helper()
	return i.Configz(t).Objects()
}
