package minion

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	goyaml "go.yaml.in/yaml/v2"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
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

// splitDocuments splits a YAML stream with apimachinery's YAMLReader, which ends a document
// only at a line starting with "---" in column 0, so an indented "---" inside a block scalar
// (a Lua comment in an EnvoyFilter) stays content. It refuses a "---" line followed by
// anything but a comment ("--- |", "--- {a: 1}", "----"): valid YAML, but not splittable by
// lines, so such a file is a syntax error. Line breaks CRLF come out as LF.
func splitDocuments(file string, data []byte) ([]document, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var docs []document
	line := 1
	for {
		chunk, err := r.Read()
		if err == io.EOF {
			return docs, nil
		}
		if err != nil {
			return nil, &SyntaxError{File: file, Line: refusedSeparator(data, line), Reason: err.Error()}
		}
		start := line
		line += bytes.Count(chunk, []byte("\n")) + 1 // its lines and the "---" that ended it
		// A "---" that opens the stream (or follows another) is kept in the chunk.
		if bytes.HasPrefix(chunk, []byte("---")) {
			_, chunk, _ = bytes.Cut(chunk, []byte("\n"))
			start++
		}
		docs = append(docs, document{line: start, data: chunk})
	}
}

// refusedSeparator returns the line YAMLReader refused: the first, from line from on, that
// starts with "---" followed by more than a comment.
func refusedSeparator(data []byte, from int) int {
	lines := bytes.SplitAfter(data, []byte("\n"))
	for i := from - 1; i < len(lines); i++ {
		rest, ok := bytes.CutPrefix(lines[i], []byte("---"))
		if rest = bytes.TrimSpace(rest); ok && len(rest) > 0 && rest[0] != '#' {
			return i + 1
		}
	}
	return from
}

// oneDocument fails unless doc holds at most one document for the parser behind
// sigs.k8s.io/yaml, which decodes only the first: besides the "---" lines YAMLReader splits
// on, that parser ends a document at "..." and at "---" after a CR, NEL, LS or PS line
// break, and reads UTF-16. Without this check the rest of the chunk would vanish silently.
func oneDocument(doc []byte) error {
	d := goyaml.NewDecoder(bytes.NewReader(doc))
	for n := 0; ; n++ {
		var v any
		err := d.Decode(&v)
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if n == 1 {
			return errors.New(`a second document starts inside this one: only a "---" line after a LF or CRLF line break separates documents`)
		}
	}
}

var yamlLine = regexp.MustCompile(`line (\d+)`)

// decodedObject is one parsed document.
type decodedObject struct {
	line int
	gvk  schema.GroupVersionKind
	obj  *Object
}

// parseDocuments parses a file's documents into objects. A file parses whole or not at all:
// a syntax error anywhere fails it (its previous objects stay published). A document that
// is not a valid object is a problem and is skipped; an empty one (null, only comments) is
// skipped silently, as kubectl does.
func parseDocuments(file string, data []byte, dirNamespace string) ([]decodedObject, []Problem, error) {
	docs, err := splitDocuments(file, data)
	if err != nil {
		return nil, nil, err
	}
	var out []decodedObject
	var problems []Problem
	for _, doc := range docs {
		js, err := yaml.YAMLToJSONStrict(doc.data)
		if err == nil {
			err = oneDocument(doc.data)
		}
		if err != nil {
			return nil, nil, &SyntaxError{File: file, Line: absLine(doc.line, err.Error()), Reason: cleanYAMLError(err.Error())}
		}
		if bytes.Equal(js, []byte("null")) {
			continue
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
