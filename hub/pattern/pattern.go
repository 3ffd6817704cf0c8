// Package pattern is the one grammar of the namespace and host patterns in the hub's
// configuration: a cluster's ownership (clusters[].namespaces, clusters[].hosts),
// sharedNamespaces and the routing rules' namespaces all parse their patterns here, so the
// same text is accepted or refused, and matches the same names, wherever it is written.
//
// Namespace patterns: "shop" (exactly that namespace), "team-*" (every namespace starting
// with "team-"; "*" may only end the pattern), "*" (every namespace). The characters are
// those of a Kubernetes namespace (a DNS-1123 label): a-z, 0-9 and "-".
//
// Host patterns: "api.example.com" (exactly that host), "*.example.com" (every host ending
// in ".example.com", at any depth, not "example.com" itself), "*" (every host). Hosts are
// lowercase DNS names without a trailing dot.
//
// It is pure: values in, decisions out. Parse errors say what is wrong with the pattern
// without quoting it; callers name the field and the pattern (ParseNamespaces does both).
package pattern

import (
	"errors"
	"fmt"
	"strings"
)

// Limits of DNS-1123 names.
const (
	// MaxLabel is the longest DNS label (and Kubernetes namespace).
	MaxLabel = 63
	// MaxName is the longest DNS name.
	MaxName = 253
)

// Kind says what a pattern matches.
type Kind int

// The kinds of pattern.
const (
	// Exact matches one name.
	Exact Kind = iota
	// Prefix (namespaces: "team-*") matches the names starting with Body.
	Prefix
	// Suffix (hosts: "*.example.com") matches the names ending in Body (".example.com").
	Suffix
	// Any ("*") matches every name.
	Any
)

// Namespace is a parsed namespace pattern.
type Namespace struct {
	kind Kind
	body string // the namespace (Exact) or the prefix (Prefix)
}

// ParseNamespace parses one namespace pattern.
func ParseNamespace(p string) (Namespace, error) {
	switch {
	case p == "":
		return Namespace{}, errors.New("empty pattern")
	case p == "*":
		return Namespace{kind: Any}, nil
	}
	body, prefix := strings.CutSuffix(p, "*")
	if body == "" || strings.Contains(body, "*") {
		return Namespace{}, errors.New(`"*" may only end the pattern, or stand alone`)
	}
	if len(body) > MaxLabel {
		return Namespace{}, fmt.Errorf("longer than %d characters", MaxLabel)
	}
	for i := 0; i < len(body); i++ {
		if ch := body[i]; !isLabelChar(ch) {
			return Namespace{}, fmt.Errorf("invalid character %q: namespace patterns use a-z, 0-9 and \"-\"", ch)
		}
	}
	if prefix {
		return Namespace{kind: Prefix, body: body}, nil
	}
	return Namespace{kind: Exact, body: body}, nil
}

// ParseNamespaces parses the patterns of one configuration field; an error names the field,
// the index and the pattern, e.g. `sharedNamespaces[1]: "": empty pattern`.
func ParseNamespaces(field string, ps []string) ([]Namespace, error) {
	out := make([]Namespace, 0, len(ps))
	for i, p := range ps {
		n, err := ParseNamespace(p)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %q: %v", field, i, p, err)
		}
		out = append(out, n)
	}
	return out, nil
}

// Kind says what n matches; Body is the namespace (Exact) or the prefix (Prefix).
func (n Namespace) Kind() Kind { return n.kind }

// Body is the namespace of an Exact pattern, the prefix of a Prefix one, "" for Any.
func (n Namespace) Body() string { return n.body }

// String is the pattern as written.
func (n Namespace) String() string {
	switch n.kind {
	case Any:
		return "*"
	case Prefix:
		return n.body + "*"
	}
	return n.body
}

// Match reports whether namespace ns matches. "*" matches every string, the empty one of a
// cluster-scoped resource included: a caller for whom cluster-scoped resources own no
// namespace checks for "" first.
func (n Namespace) Match(ns string) bool {
	switch n.kind {
	case Any:
		return true
	case Prefix:
		return strings.HasPrefix(ns, n.body)
	}
	return ns == n.body
}

// Overlap returns the namespaces n and o both match, as a pattern, and whether there are
// any.
func (n Namespace) Overlap(o Namespace) (Namespace, bool) {
	switch {
	case n.kind == Any:
		return o, true
	case o.kind == Any:
		return n, true
	case n.kind == Exact:
		return n, o.Match(n.body)
	case o.kind == Exact:
		return o, n.Match(o.body)
	case strings.HasPrefix(n.body, o.body): // both prefixes: the longer one is the overlap
		return n, true
	case strings.HasPrefix(o.body, n.body):
		return o, true
	}
	return Namespace{}, false
}

// Covers reports whether n matches every namespace o matches.
func (n Namespace) Covers(o Namespace) bool {
	switch n.kind {
	case Any:
		return true
	case Prefix:
		return o.kind != Any && strings.HasPrefix(o.body, n.body)
	}
	return o.kind == Exact && o.body == n.body
}

// Host is a parsed host pattern.
type Host struct {
	kind Kind
	body string // the host (Exact) or the suffix with its leading "." (Suffix)
}

// ParseHost parses one host pattern.
func ParseHost(p string) (Host, error) {
	switch {
	case p == "":
		return Host{}, errors.New("empty pattern")
	case p == "*":
		return Host{kind: Any}, nil
	case p[0] == '*' && (len(p) < 2 || p[1] != '.'):
		return Host{}, errors.New(`a wildcard must be "*" or start with "*."`)
	}
	name, wild := strings.CutPrefix(p, "*.")
	if strings.Contains(name, "*") {
		return Host{}, errors.New(`"*" may only appear as the whole pattern or in a leading "*."`)
	}
	if strings.HasSuffix(name, ".") {
		return Host{}, errors.New(`must not end with "."`)
	}
	if len(p) > MaxName {
		return Host{}, fmt.Errorf("longer than %d characters", MaxName)
	}
	for label := range strings.SplitSeq(name, ".") {
		if label == "" {
			return Host{}, errors.New("empty label")
		}
		if len(label) > MaxLabel {
			return Host{}, fmt.Errorf("label %q is longer than %d characters", label, MaxLabel)
		}
		for i := 0; i < len(label); i++ {
			ch := label[i]
			if 'A' <= ch && ch <= 'Z' {
				return Host{}, errors.New("must be lowercase")
			}
			if !isLabelChar(ch) {
				return Host{}, fmt.Errorf("invalid character %q: host labels use a-z, 0-9 and \"-\"", ch)
			}
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return Host{}, fmt.Errorf("label %q must start and end with a letter or digit", label)
		}
	}
	if wild {
		return Host{kind: Suffix, body: p[1:]}, nil
	}
	return Host{kind: Exact, body: p}, nil
}

// Kind says what h matches.
func (h Host) Kind() Kind { return h.kind }

// Body is the host of an Exact pattern, the suffix (".example.com") of a Suffix one, ""
// for Any.
func (h Host) Body() string { return h.body }

// String is the pattern as written.
func (h Host) String() string {
	switch h.kind {
	case Any:
		return "*"
	case Suffix:
		return "*" + h.body
	}
	return h.body
}

func isLabelChar(ch byte) bool {
	return 'a' <= ch && ch <= 'z' || '0' <= ch && ch <= '9' || ch == '-'
}

// Overlap returns the hosts h and o both match, as a pattern, and whether there are any. A
// Suffix pattern matches the names below its suffix, not the suffix itself: "*.a.com" and
// "a.com" do not overlap.
func (h Host) Overlap(o Host) (Host, bool) {
	switch {
	case h.kind == Any:
		return o, true
	case o.kind == Any:
		return h, true
	case h.kind == Exact && o.kind == Exact:
		return h, h.body == o.body
	case h.kind == Exact:
		return h, strings.HasSuffix(h.body, o.body)
	case o.kind == Exact:
		return o, strings.HasSuffix(o.body, h.body)
	case strings.HasSuffix(h.body, o.body): // both suffixes: the longer one is the overlap
		return h, true
	case strings.HasSuffix(o.body, h.body):
		return o, true
	}
	return Host{}, false
}
