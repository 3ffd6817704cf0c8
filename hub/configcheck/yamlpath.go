package configcheck

import (
	"maps"
	"reflect"
	"strconv"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// A field path is how the hub's configuration errors name a field:
//
//	tenants[0] ("acme").clusters[1] ("east").hosts[2]
//	staleness.collections[istio/networking/v1alpha3/virtualservices]
//	limits.maxStreamsPerPeer
//
// dot-separated keys, each followed by indexes into a list ([2]) or keys of a map
// ([name]), and, after a list item, the item's name in parentheses for people (skipped
// here). encoding/json names the fields of a type error with dots alone (clusters.name):
// a key looked up in a list is looked up in its first item that has it.

// step is one step of a field path: a map key, or (key == "" ) an index into a list.
type step struct {
	key   string
	index int
}

// parsePath reads the field path at the start of s (up to the ": " that ends it in an
// error message) into steps; ok is false when s does not start with one.
func parsePath(s string) (steps []step, ok bool) {
	i := 0
	for {
		start := i
		for i < len(s) && (isKeyChar(s[i])) {
			i++
		}
		if i == start {
			return nil, false
		}
		steps = append(steps, step{key: s[start:i]})
		for i < len(s) && s[i] == '[' {
			end := strings.IndexByte(s[i:], ']')
			if end < 0 {
				return nil, false
			}
			inner := s[i+1 : i+end]
			if n, err := strconv.Atoi(inner); err == nil && n >= 0 {
				steps = append(steps, step{index: n})
			} else if inner != "" {
				steps = append(steps, step{key: inner})
			} else {
				return nil, false
			}
			i += end + 1
		}
		if strings.HasPrefix(s[i:], ` ("`) { // the item's name, for people
			end := strings.Index(s[i+3:], `")`)
			if end < 0 {
				return nil, false
			}
			i += 3 + end + 2
		}
		if i < len(s) && s[i] == '.' {
			i++
			continue
		}
		return steps, i == len(s) || s[i] == ':' || s[i] == ' '
	}
}

func isKeyChar(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// Line returns the line in data (a YAML document) of the deepest node the field path at
// the start of path reaches: the field itself, or, when the file leaves it out, the
// nearest enclosing one that is there. 0: the path is not one, or data does not parse.
func Line(data []byte, path string) int {
	steps, ok := parsePath(path)
	if !ok {
		return 0
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return 0
	}
	line := 0
	n := doc.Content[0]
	for _, st := range steps {
		next, keyLine := child(n, st)
		if next == nil {
			break
		}
		line, n = keyLine, next
	}
	return line
}

// child is the node st reaches from n, and the line to report for it (a map entry's key's:
// where a person reads the field's name), or nil.
func child(n *yaml.Node, st step) (*yaml.Node, int) {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch {
	case n.Kind == yaml.SequenceNode && st.key == "":
		if st.index < len(n.Content) {
			return n.Content[st.index], n.Content[st.index].Line
		}
	case n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == st.key {
				return n.Content[i+1], n.Content[i].Line
			}
		}
	case n.Kind == yaml.SequenceNode: // a key of a list's items (encoding/json's paths)
		for _, item := range n.Content {
			if c, line := child(item, st); c != nil {
				return c, line
			}
		}
	}
	return nil, 0
}

// UnknownKeyLine returns the line of the first mapping key named key where the type the
// file decodes into (t, as encoding/json reads it: fields by their json names) has no such
// field, or 0. The decoder names an unknown field without its path; a key of that name may
// well be valid elsewhere in the file (namespaces under clusters, not under limits).
func UnknownKeyLine(data []byte, t reflect.Type, key string) int {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 {
		return 0
	}
	return unknownKey(doc.Content[0], t, key)
}

func unknownKey(n *yaml.Node, t reflect.Type, key string) int {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case n.Kind == yaml.SequenceNode && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array):
		for _, item := range n.Content {
			if l := unknownKey(item, t.Elem(), key); l > 0 {
				return l
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Map:
		for i := 1; i < len(n.Content); i += 2 {
			if l := unknownKey(n.Content[i], t.Elem(), key); l > 0 {
				return l
			}
		}
	case n.Kind == yaml.MappingNode && t.Kind() == reflect.Struct:
		fields := jsonFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			name := n.Content[i].Value
			ft, ok := fields[name]
			for f, typ := range fields {
				if !ok && strings.EqualFold(f, name) { // as encoding/json matches them
					ft, ok = typ, true
				}
			}
			if !ok {
				if name == key {
					return n.Content[i].Line
				}
				continue
			}
			if l := unknownKey(n.Content[i+1], ft, key); l > 0 {
				return l
			}
		}
	}
	return 0
}

// jsonFields are the fields of struct type t by the names encoding/json reads them under,
// those of embedded structs included.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case name == "-" || !f.IsExported() && !f.Anonymous:
		case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
			maps.Copy(out, jsonFields(f.Type))
		case name == "":
			out[f.Name] = f.Type
		default:
			out[name] = f.Type
		}
	}
	return out
}
