package minion

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"
)

// Problem is something wrong with one input, reported with where it is.
type Problem struct {
	// Where: "file.yaml:12" for files, "namespace/name" for Kubernetes objects.
	Where string
	// Collection and Resource name the object concerned, when known.
	Collection, Resource string
	// Reason says what is wrong.
	Reason string
}

func (p Problem) String() string {
	if p.Resource != "" {
		return fmt.Sprintf("%s: %s %s: %s", p.Where, p.Collection, p.Resource, p.Reason)
	}
	return p.Where + ": " + p.Reason
}

// SyntaxError is a file that does not parse as YAML or JSON.
type SyntaxError struct {
	File   string
	Line   int
	Reason string
}

func (e *SyntaxError) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Reason) }

// document is one YAML document of a file, with the line it starts on.
type document struct {
	line int
	data []byte
}

// splitDocuments splits a multi-document YAML stream on "---" separator lines.
func splitDocuments(data []byte) []document {
	var docs []document
	start, line := 1, 1
	var cur bytes.Buffer
	for _, l := range bytes.SplitAfter(data, []byte("\n")) {
		trimmed := bytes.TrimSpace(l)
		if bytes.Equal(trimmed, []byte("---")) || bytes.HasPrefix(trimmed, []byte("--- ")) || bytes.HasPrefix(trimmed, []byte("---#")) {
			docs = append(docs, document{line: start, data: bytes.Clone(cur.Bytes())})
			cur.Reset()
			start = line + 1
		} else {
			cur.Write(l)
		}
		line++
	}
	docs = append(docs, document{line: start, data: cur.Bytes()})
	return docs
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// decodedObject is one parsed document.
type decodedObject struct {
	line int
	gvk  schema.GroupVersionKind
	obj  *Object
}

// parseDocuments parses a file's documents into objects. A syntax error in any document
// fails the whole file (its previous objects stay published); a document that is not a
// valid object is a problem and is skipped.
func parseDocuments(file string, data []byte, dirNamespace string) ([]decodedObject, []Problem, error) {
	var out []decodedObject
	var problems []Problem
	for _, doc := range splitDocuments(data) {
		if len(bytes.TrimSpace(stripComments(doc.data))) == 0 {
			continue
		}
		js, err := yaml.YAMLToJSONStrict(doc.data)
		if err != nil {
			return nil, nil, &SyntaxError{File: file, Line: absLine(doc.line, err.Error()), Reason: cleanYAMLError(err.Error())}
		}
		var m map[string]any
		if err := json.Unmarshal(js, &m); err != nil || m == nil {
			problems = append(problems, Problem{Where: fmt.Sprintf("%s:%d", file, doc.line), Reason: "document is not an object"})
			continue
		}
		d, err := objectFromMap(m, dirNamespace)
		if err != nil {
			problems = append(problems, Problem{Where: fmt.Sprintf("%s:%d", file, doc.line), Reason: err.Error()})
			continue
		}
		d.line = doc.line
		out = append(out, d)
	}
	return out, problems, nil
}

func stripComments(b []byte) []byte {
	var out bytes.Buffer
	for _, l := range bytes.Split(b, []byte("\n")) {
		if t := bytes.TrimSpace(l); len(t) > 0 && t[0] != '#' {
			out.Write(l)
			out.WriteByte('\n')
		}
	}
	return out.Bytes()
}

// absLine turns the line a YAML error names (relative to its document) into a file line.
func absLine(docStart int, msg string) int {
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			return docStart + n - 1
		}
	}
	return docStart
}

func cleanYAMLError(msg string) string {
	msg = strings.TrimPrefix(msg, "error converting YAML to JSON: ")
	msg = yamlLine.ReplaceAllString(msg, "")
	msg = strings.ReplaceAll(msg, "yaml: : ", "")
	msg = strings.TrimPrefix(msg, "yaml: ")
	return strings.TrimSpace(msg)
}

// objectFromMap reads apiVersion, kind and metadata of a decoded object.
func objectFromMap(m map[string]any, defaultNamespace string) (decodedObject, error) {
	apiVersion, _ := m["apiVersion"].(string)
	kind, _ := m["kind"].(string)
	if apiVersion == "" || kind == "" {
		return decodedObject{}, fmt.Errorf("apiVersion and kind are required")
	}
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return decodedObject{}, fmt.Errorf("apiVersion %q: %v", apiVersion, err)
	}
	md, ok := m["metadata"].(map[string]any)
	if !ok {
		return decodedObject{}, fmt.Errorf("%s: metadata is missing or not an object", kind)
	}
	o := &Object{Content: map[string]any{}}
	if o.Name, ok = md["name"].(string); !ok || o.Name == "" {
		return decodedObject{}, fmt.Errorf("%s: metadata.name is missing", kind)
	}
	if ns, present := md["namespace"]; present {
		if o.Namespace, ok = ns.(string); !ok {
			return decodedObject{}, fmt.Errorf("%s %s: metadata.namespace is not a string", kind, o.Name)
		}
	}
	if o.Namespace == "" {
		o.Namespace = defaultNamespace
	}
	if o.Labels, err = stringMap(md["labels"]); err != nil {
		return decodedObject{}, fmt.Errorf("%s %s: metadata.labels: %v", kind, o.Name, err)
	}
	if o.Annotations, err = stringMap(md["annotations"]); err != nil {
		return decodedObject{}, fmt.Errorf("%s %s: metadata.annotations: %v", kind, o.Name, err)
	}
	if ts, ok := md["creationTimestamp"].(string); ok && ts != "" {
		if o.Created, err = time.Parse(time.RFC3339, ts); err != nil {
			return decodedObject{}, fmt.Errorf("%s %s: metadata.creationTimestamp: %v", kind, o.Name, err)
		}
	}
	for k, v := range m {
		if k != "apiVersion" && k != "kind" && k != "metadata" {
			o.Content[k] = v
		}
	}
	return decodedObject{gvk: gv.WithKind(kind), obj: o}, nil
}

func stringMap(v any) (map[string]string, error) {
	if v == nil {
		return nil, nil
	}
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("not a map")
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("value of %q is not a string", k)
		}
		out[k] = s
	}
	return out, nil
}
