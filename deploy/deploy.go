// Package deploy holds meshfed's deployment manifests, as kustomize bases: hub/ (the hub,
// for the cluster that runs it), minion/ (one per member cluster) and monitoring/ (the
// Prometheus Operator's objects and a Grafana dashboard for the hub, tested by the module
// test/monitoring, which renders it with Render); the Dockerfile that builds the images is
// at the repository root. The Go files only hold the tests that check
// them: the rendered manifests are accepted by a real kube-apiserver (server-side dry-run),
// the hub's ConfigMap is a valid hub configuration that agrees with its Deployment, the
// Deployments are hardened, and the Dockerfile has the expected shape.
//
// It has no product code. Render is the small kustomize subset the tests use, so that they
// need no kustomize binary.
package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// clusterScoped are the kinds Render never gives a namespace.
var clusterScoped = map[string]bool{
	"Namespace":                true,
	"ClusterRole":              true,
	"ClusterRoleBinding":       true,
	"CustomResourceDefinition": true,
}

// object is one rendered object and where it came from.
type object struct {
	file string // path of the resource file, as dir/name
	line int    // first line of its document
	obj  map[string]any
}

func (o object) kind() string { s, _ := o.obj["kind"].(string); return s }

func (o object) meta() map[string]any { m, _ := o.obj["metadata"].(map[string]any); return m }

func (o object) name() string { s, _ := o.meta()["name"].(string); return s }

func (o object) namespace() string { s, _ := o.meta()["namespace"].(string); return s }

func (o object) String() string {
	return fmt.Sprintf("%s:%d: %s %s", o.file, o.line, o.kind(), o.name())
}

// Render builds the kustomization in dir the way kustomize would, for the subset of
// kustomize it supports: a kustomization.yaml whose only keys (besides apiVersion and kind)
// are namespace and resources, resources being file names in dir. Each file may hold
// several YAML documents separated by lines that are exactly "---". Namespaced objects
// without a namespace get the kustomization's; every kind except Namespace, ClusterRole,
// ClusterRoleBinding and CustomResourceDefinition is taken to be namespaced. Anything else
// is an error naming the file.
func Render(dir string) ([]map[string]any, error) {
	objs, err := render(dir)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, len(objs))
	for i, o := range objs {
		out[i] = o.obj
	}
	return out, nil
}

func render(dir string) ([]object, error) {
	kpath := filepath.Join(dir, "kustomization.yaml")
	data, err := os.ReadFile(kpath)
	if err != nil {
		return nil, err
	}
	var k map[string]any
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("%s: %v", kpath, err)
	}
	var unknown []string
	for key := range k {
		switch key {
		case "apiVersion", "kind", "namespace", "resources":
		default:
			unknown = append(unknown, key)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return nil, fmt.Errorf("%s: unsupported keys %q: only namespace and resources are rendered", kpath, unknown)
	}
	if v, ok := k["apiVersion"]; ok && v != "kustomize.config.k8s.io/v1beta1" {
		return nil, fmt.Errorf("%s: apiVersion %v: want kustomize.config.k8s.io/v1beta1", kpath, v)
	}
	if v, ok := k["kind"]; ok && v != "Kustomization" {
		return nil, fmt.Errorf("%s: kind %v: want Kustomization", kpath, v)
	}
	ns, ok := k["namespace"].(string)
	if _, set := k["namespace"]; set && (!ok || ns == "") {
		return nil, fmt.Errorf("%s: namespace: want a non-empty string", kpath)
	}
	list, ok := k["resources"].([]any)
	if !ok || len(list) == 0 {
		return nil, fmt.Errorf("%s: resources: want a non-empty list of file names", kpath)
	}
	var objs []object
	seenFile := map[string]bool{}
	seenObj := map[string]string{} // apiVersion/kind/namespace/name -> where
	for i, r := range list {
		name, ok := r.(string)
		if !ok || name == "" || name != filepath.Base(name) || name == "." || name == ".." {
			return nil, fmt.Errorf("%s: resources[%d]: %v is not a file name in %s (directories and remote bases are not supported)", kpath, i, r, dir)
		}
		if seenFile[name] {
			return nil, fmt.Errorf("%s: resources[%d]: %s is listed twice", kpath, i, name)
		}
		seenFile[name] = true
		fobjs, err := readFile(filepath.Join(dir, name), ns)
		if err != nil {
			return nil, err
		}
		for _, o := range fobjs {
			id := fmt.Sprintf("%v %s %s/%s", o.obj["apiVersion"], o.kind(), o.namespace(), o.name())
			if where, dup := seenObj[id]; dup {
				return nil, fmt.Errorf("%s:%d: %s %s is also defined at %s", o.file, o.line, o.kind(), o.name(), where)
			}
			seenObj[id] = fmt.Sprintf("%s:%d", o.file, o.line)
			objs = append(objs, o)
		}
	}
	return objs, nil
}

// readFile parses a multi-document YAML file and applies namespace ns ("" for none).
func readFile(path, ns string) ([]object, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var objs []object
	var doc bytes.Buffer
	start, n := 1, 0 // first line and number (from 1) of the current document
	flush := func() error {
		defer doc.Reset()
		n++
		var m map[string]any
		if err := yaml.Unmarshal(doc.Bytes(), &m); err != nil {
			return fmt.Errorf("%s: document %d (line %d): %v", path, n, start, err)
		}
		if len(m) == 0 { // only comments
			return nil
		}
		o := object{file: path, line: start, obj: m}
		if err := o.check(ns); err != nil {
			return fmt.Errorf("%s: document %d (line %d): %v", path, n, start, err)
		}
		objs = append(objs, o)
		return nil
	}
	lines := strings.SplitAfter(string(data), "\n")
	for i, line := range lines {
		trimmed := strings.TrimRight(line, "\r\n")
		if trimmed == "---" {
			if err := flush(); err != nil {
				return nil, err
			}
			start = i + 2
			continue
		}
		if strings.HasPrefix(trimmed, "--- ") || strings.HasPrefix(trimmed, "---\t") {
			// YAML would start a document here too; the renderer only splits on "---" alone.
			return nil, fmt.Errorf("%s:%d: %q: separate documents with lines that are exactly \"---\"", path, i+1, trimmed)
		}
		doc.WriteString(line)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(objs) == 0 {
		return nil, fmt.Errorf("%s: no objects", path)
	}
	return objs, nil
}

// check requires apiVersion, kind and metadata.name, and applies namespace ns.
func (o object) check(ns string) error {
	for _, f := range []string{"apiVersion", "kind"} {
		if s, _ := o.obj[f].(string); s == "" {
			return fmt.Errorf("%s: required", f)
		}
	}
	if _, ok := o.obj["metadata"].(map[string]any); !ok {
		return errors.New("metadata: required")
	}
	if o.name() == "" {
		return errors.New("metadata.name: required")
	}
	if v, set := o.meta()["namespace"]; set {
		if s, ok := v.(string); !ok || s == "" {
			return errors.New("metadata.namespace: want a non-empty string")
		}
	}
	switch have := o.namespace(); {
	case clusterScoped[o.kind()]:
		if have != "" {
			return fmt.Errorf("%s %s is cluster-scoped but has metadata.namespace %q", o.kind(), o.name(), have)
		}
	case ns == "":
	case have == "":
		o.meta()["namespace"] = ns
	case have != ns:
		// kustomize would silently move it to ns: say so instead.
		return fmt.Errorf("%s %s: metadata.namespace %q differs from the kustomization's namespace %q, which would replace it", o.kind(), o.name(), have, ns)
	}
	return nil
}
