// Package kubetest runs a real Kubernetes control plane — etcd and kube-apiserver, built
// from the pinned module test/kube by package testbin — on 127.0.0.1 for integration tests,
// and gives tests admin and least-privilege clients, manifest apply, and an apiserver
// restart. StartForMinion starts one set up as the minion is deployed: Istio's CRDs and
// the minion's RBAC applied, and the identity of its ServiceAccount.
//
// The apiserver authenticates with a static token file (an admin in system:masters and one
// identity per service account a test registers) and authorizes with RBAC only, so a client
// built for a service account has exactly the permissions its Roles grant. It is test
// infrastructure: nothing in the product imports it.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/yaml"

	"github.com/meshfed/meshfed/internal/testkit/testbin"
	"github.com/meshfed/meshfed/internal/testkit/testproc"
)

// TB is the part of testing.TB this package uses, so that the benchmark command, which is
// not a test, can run a control plane too.
type TB interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Cleanup(func())
	TempDir() string
}

// Identity is a user the apiserver authenticates by bearer token.
type Identity struct {
	User   string
	Groups []string
	Token  string
}

// ServiceAccount returns the identity the apiserver gives service account ns/name's tokens,
// so RBAC bindings to that ServiceAccount apply to it.
func ServiceAccount(ns, name string) Identity {
	return Identity{
		User:   "system:serviceaccount:" + ns + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		Token:  randomToken(),
	}
}

// Env is a running etcd + kube-apiserver.
type Env struct {
	// Dir holds the data, certificates and kubeconfigs; removed by the test's cleanup.
	Dir string
	// Host is the apiserver's https URL.
	Host string
	// Admin is the system:masters identity.
	Admin Identity

	t          TB
	apiBin     string
	apiArgs    []string
	etcd       *testproc.Proc
	mu         sync.Mutex // guards api
	api        *testproc.Proc
	identities []Identity
}

// Start runs etcd and kube-apiserver and waits until the apiserver is ready. identities are
// extra users the token file knows (see ServiceAccount). Everything is stopped by t's
// cleanup.
func Start(t TB, identities ...Identity) *Env {
	t.Helper()
	etcdBin := testbin.Require(t, "etcd")
	apiBin := testbin.Require(t, "kube-apiserver")
	dir := t.TempDir()
	e := &Env{Dir: dir, t: t, apiBin: apiBin, Admin: Identity{User: "admin", Groups: []string{"system:masters"}, Token: randomToken()},
		identities: identities}

	clientPort, peerPort := freePort(t), freePort(t)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	e.etcd = testproc.Start(t, testproc.Options{Name: "etcd", Path: etcdBin, Args: []string{
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:" + strconv.Itoa(peerPort),
		"--initial-advertise-peer-urls", "http://127.0.0.1:" + strconv.Itoa(peerPort),
		"--initial-cluster", "default=http://127.0.0.1:" + strconv.Itoa(peerPort),
		"--listen-metrics-urls", "http://127.0.0.1:" + strconv.Itoa(freePort(t)),
		"--log-level", "warn", "--quota-backend-bytes", strconv.Itoa(2 << 30),
	}})

	writeSAKey(t, dir)
	var tokens bytes.Buffer
	for i, id := range append([]Identity{e.Admin}, identities...) {
		fmt.Fprintf(&tokens, "%s,%s,%d,%q\n", id.Token, id.User, i+1, strings.Join(id.Groups, ","))
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), tokens.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	e.Host = "https://127.0.0.1:" + strconv.Itoa(port)
	e.apiArgs = []string{
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(port),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", filepath.Join(dir, "sa.pub"),
		"--service-account-signing-key-file", filepath.Join(dir, "sa.key"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-cluster-ip-range", "10.96.0.0/24",
		"--enable-priority-and-fairness=false",
		"--v", "0",
	}
	e.startAPI()
	return e
}

// The minion's ServiceAccount, as deploy/minion/rbac.yaml declares and binds it.
const (
	minionNamespace      = "meshfed"
	minionServiceAccount = "meshfed-minion"
)

// StartForMinion is Start for tests of the minion against Kubernetes: it applies Istio's
// CRDs (test/kube/crds.yaml, waiting until they are established) and the minion's RBAC as
// deployed (deploy/minion/rbac.yaml), both read below repoRoot, the meshfed repository's
// root. It returns the env and the identity of the minion's ServiceAccount, whose
// permissions are exactly what that RBAC grants — so a minion given env.Kubeconfig(minion)
// also proves the deployed least-privilege role is enough.
func StartForMinion(t TB, repoRoot string) (env *Env, minion Identity) {
	t.Helper()
	minion = ServiceAccount(minionNamespace, minionServiceAccount)
	env = Start(t, minion)
	env.ApplyFile(filepath.Join(repoRoot, "test/kube/crds.yaml"))
	env.ApplyFile(filepath.Join(repoRoot, "deploy/minion/rbac.yaml"))
	return env, minion
}

func (e *Env) startAPI() {
	e.t.Helper()
	p := testproc.Start(e.t, testproc.Options{Name: "kube-apiserver", Path: e.apiBin, Args: e.apiArgs})
	e.mu.Lock()
	e.api = p
	e.mu.Unlock()
	e.waitReady(p)
}

// RestartAPIServer kills the apiserver with SIGKILL and starts it again on the same address
// (etcd keeps the data), waiting until it is ready.
func (e *Env) RestartAPIServer() {
	e.t.Helper()
	e.mu.Lock()
	p := e.api
	e.mu.Unlock()
	p.Kill()
	e.startAPI()
}

// StopAPIServer kills the apiserver with SIGKILL; StartAPIServer brings it back.
func (e *Env) StopAPIServer() {
	e.mu.Lock()
	p := e.api
	e.mu.Unlock()
	p.Kill()
}

// StartAPIServer starts the apiserver after StopAPIServer and waits until it is ready.
func (e *Env) StartAPIServer() { e.t.Helper(); e.startAPI() }

func (e *Env) waitReady(p *testproc.Proc) {
	e.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	var last string
	for time.Now().Before(deadline) {
		if p.Exited() {
			e.t.Fatalf("kube-apiserver exited while starting:\n%s", p.Tail(tailLines))
		}
		// The serving certificate is generated at start: read it at every attempt (a
		// client-go transport is cached by the CA file's name and would keep a CA read
		// before the file was complete). /readyz is public: no credentials needed.
		pool := x509.NewCertPool()
		if pem, err := os.ReadFile(filepath.Join(e.Dir, "certs", "apiserver.crt")); err == nil {
			pool.AppendCertsFromPEM(pem)
		}
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 2 * time.Second}
		resp, err := hc.Get(e.Host + "/readyz")
		hc.CloseIdleConnections()
		if err == nil {
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	e.t.Fatalf("kube-apiserver not ready after 90s (last: %s)\n%s", last, p.Tail(tailLines))
}

// Config returns a client config for identity id, trusting the apiserver's self-signed
// serving certificate.
func (e *Env) Config(id Identity) *rest.Config {
	cfg := &rest.Config{Host: e.Host, BearerToken: id.Token, QPS: 200, Burst: 400, Timeout: 30 * time.Second}
	cfg.TLSClientConfig.CAFile = filepath.Join(e.Dir, "certs", "apiserver.crt")
	return cfg
}

// Kubeconfig writes a kubeconfig file for identity id (context "test") and returns its path.
func (e *Env) Kubeconfig(id Identity) string {
	e.t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: e.Host, CertificateAuthority: filepath.Join(e.Dir, "certs", "apiserver.crt")}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{Token: id.Token}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(e.Dir, "kubeconfig-"+strings.NewReplacer(":", "_", "/", "_").Replace(id.User))
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		e.t.Fatal(err)
	}
	return path
}

// Dynamic returns an admin dynamic client.
func (e *Env) Dynamic() dynamic.Interface {
	e.t.Helper()
	c, err := dynamic.NewForConfig(e.Config(e.Admin))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// Clientset returns an admin typed client.
func (e *Env) Clientset() kubernetes.Interface {
	e.t.Helper()
	c, err := kubernetes.NewForConfig(e.Config(e.Admin))
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// ApplyFile applies every object of a multi-document YAML file as admin (server-side apply)
// and waits for CustomResourceDefinitions among them to be established.
func (e *Env) ApplyFile(path string) {
	e.t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		e.t.Fatal(err)
	}
	e.Apply(string(data))
}

// Apply applies every object of a multi-document YAML string as admin (server-side apply,
// field manager "kubetest") and waits for CRDs among them to be established.
func (e *Env) Apply(manifests string) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dc, err := discovery.NewDiscoveryClientForConfig(e.Config(e.Admin))
	if err != nil {
		e.t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn := e.Dynamic()
	var crds []string
	for i, doc := range strings.Split(manifests, "\n---") {
		var obj map[string]any
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			e.t.Fatalf("manifest document %d: %v", i, err)
		}
		if len(obj) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: obj}
		gvk := u.GroupVersionKind()
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			mapper.Reset()
			if mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				e.t.Fatalf("manifest document %d (%s %s): %v", i, gvk, u.GetName(), err)
			}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
		if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := u.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			ri = dyn.Resource(mapping.Resource).Namespace(ns)
		}
		body, err := u.MarshalJSON()
		if err != nil {
			e.t.Fatal(err)
		}
		force := true
		if _, err := ri.Patch(ctx, u.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "kubetest", Force: &force}); err != nil {
			e.t.Fatalf("apply %s %s/%s: %v", gvk.Kind, u.GetNamespace(), u.GetName(), err)
		}
		if gvk.Kind == "CustomResourceDefinition" {
			crds = append(crds, u.GetName())
		}
	}
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	for _, name := range crds {
		for {
			u, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err == nil && crdEstablished(u) {
				break
			}
			if ctx.Err() != nil {
				e.t.Fatalf("CRD %s not established: %v", name, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func crdEstablished(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// CreateNamespace creates a namespace as admin.
func (e *Env) CreateNamespace(name string) {
	e.t.Helper()
	e.Apply(fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: %s\n", name))
}

// tailLines is how many of a process's last lines of output a failure message shows.
const tailLines = 40

// freePort returns a port that was free a moment ago on 127.0.0.1. The programs started
// here take ports as flags, so a listener cannot be handed over.
func freePort(t TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func writeSAKey(t TB, dir string) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"sa.key": {Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)},
		"sa.pub": {Type: "PUBLIC KEY", Bytes: pub},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func randomToken() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(errors.New("kubetest: no randomness"))
	}
	return hex.EncodeToString(b)
}
